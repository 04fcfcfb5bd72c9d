// Writes the published vocabularies of two npm packages in the forms their owners publish:
//   NAME_base OUT                js-tiktoken's ranks (cl100k_base, o200k_base, ...) as a tiktoken rank file ("base64 rank" lines)
//   llama3 OUT                   Llama 3's tokenizer.json (llama3-tokenizer-js's vocabulary and
//                                merges; a Split by Llama 3's pattern, ByteLevel, a bos template,
//                                ignore_merges, its 256 special tokens)
//   llama3-ranks OUT             the same vocabulary as Llama 3's original tokenizer.model (a rank
//                                file: each token's bytes, ranked by id)
// Usage: node tiktoken_files.mjs <node_modules> <what> <out>
import fs from "fs";
import path from "path";

const [modulesArg, what, out] = process.argv.slice(2);
const modules = path.resolve(modulesArg);

if (what.endsWith("_base")) {
  const ranks = (await import(`${modules}/js-tiktoken/dist/ranks/${what}.js`)).default;
  const lines = [];
  for (const row of ranks.bpe_ranks.split("\n").filter(Boolean)) {
    const [, offset, ...tokens] = row.split(" ");
    tokens.forEach((token, i) => lines.push(`${token} ${Number(offset) + i}`));
  }
  fs.writeFileSync(out, lines.join("\n") + "\n");
} else {
  const llama3 = (await import(`${modules}/llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js`)).default;
  const specialFrom = 128000;
  const tokens = llama3.vocabById;
  if (what === "llama3-ranks") {
    // GPT-2's byte symbols back to bytes.
    const printable = [];
    for (let b = 33; b <= 126; ++b) printable.push(b);
    for (let b = 161; b <= 172; ++b) printable.push(b);
    for (let b = 174; b <= 255; ++b) printable.push(b);
    const byteOf = new Map(printable.map((b) => [String.fromCharCode(b), b]));
    let next = 256;
    for (let b = 0; b < 256; ++b) if (!printable.includes(b)) byteOf.set(String.fromCharCode(next++), b);
    const lines = [];
    for (let id = 0; id < specialFrom; ++id) {
      const bytes = Uint8Array.from([...tokens[id]].map((c) => byteOf.get(c)));
      lines.push(`${Buffer.from(bytes).toString("base64")} ${id}`);
    }
    fs.writeFileSync(out, lines.join("\n") + "\n");
  } else {
    const vocab = {};
    for (let id = 0; id < specialFrom; ++id) vocab[tokens[id]] = id;
    const merges = [...llama3.merges.keys()];  // in priority order
    const added = tokens.slice(specialFrom).map((content, i) => ({
      id: specialFrom + i, content, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: true,
    }));
    const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false };
    const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const bos = "<|begin_of_text|>";
    fs.writeFileSync(out, JSON.stringify({
      version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
      pre_tokenizer: { type: "Sequence", pretokenizers: [
        { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false }, byteLevel] },
      post_processor: { type: "Sequence", processors: [
        { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
        { type: "TemplateProcessing",
          single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
          pair: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
                 { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
          special_tokens: { [bos]: { id: bos, ids: [specialFrom], tokens: [bos] } } }] },
      decoder: byteLevel,
      model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
               end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
               vocab, merges },
    }));
  }
}
