// Writes the tokenizer.json of a SentencePiece-style vocabulary that an npm package carries
// (llama-tokenizer-js: Llama 2's 32,000 tokens; mistral-tokenizer-js: Mistral 7B's), in the form
// Hugging Face publishes for those models: a Prepend and Replace normalizer ("legacy") or, with
// --metaspace, a Metaspace pre-tokenizer and decoder (prepend_scheme "first"), byte fallback,
// fused unknown tokens and a template that adds <s>.
// Usage: node sentencepiece_json.mjs <node_modules> llama2|mistral <out.json> [--metaspace]
import fs from "fs";
import path from "path";

const [modulesArg, name, out, form] = process.argv.slice(2);
const modules = path.resolve(modulesArg);
let vocab;
let merges;
if (name === "llama2") {
  const { LlamaTokenizer } = await import(`${modules}/llama-tokenizer-js/llama-tokenizer.js`);
  const tokenizer = new LlamaTokenizer();
  vocab = tokenizer.vocabById;
  merges = tokenizer.merges;
} else if (name === "mistral") {
  const tokenizer = (await import(`${modules}/mistral-tokenizer-js/mistral-tokenizer.js`)).default;
  vocab = tokenizer.vocabById;
  merges = tokenizer.merges;
} else {
  throw new Error(`unknown vocabulary ${name}`);
}
// The packages key a merge by "left right" and rank it by its place in the file.
const ranked = [...merges.entries()].sort((a, b) => a[1] - b[1]).map(([pair]) => pair);
const specials = ["<unk>", "<s>", "</s>"];
const doc = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: specials.map((content, id) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false,
    special: true,
  })),
  normalizer: {
    type: "Sequence",
    normalizers: [
      { type: "Prepend", prepend: "\u2581" },
      { type: "Replace", pattern: { String: " " }, content: "\u2581" },
    ],
  },
  pre_tokenizer: null,
  post_processor: {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [
      { SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
      { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } },
    ],
    special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
  },
  decoder: {
    type: "Sequence",
    decoders: [
      { type: "Replace", pattern: { String: "\u2581" }, content: " " },
      { type: "ByteFallback" },
      { type: "Fuse" },
      { type: "Strip", content: " ", start: 1, stop: 0 },
    ],
  },
  model: {
    type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
    vocab: Object.fromEntries(vocab.map((token, id) => [token, id])),
    merges: ranked,
  },
};
if (form === "--metaspace") {
  doc.normalizer = null;
  doc.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
  doc.decoder = {
    type: "Sequence",
    decoders: [
      { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false },
      { type: "ByteFallback" },
      { type: "Fuse" },
    ],
  };
}
fs.writeFileSync(out, JSON.stringify(doc));
