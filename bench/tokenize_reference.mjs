// Times the JavaScript references on a text, for `meshtensor bench tokenize --reference`: Hugging
// Face's own implementation (npm @huggingface/tokenizers) on the tokenizer.json, and, when named,
// the vocabulary's own package (gpt-3-encoder, llama-tokenizer-js, mistral-tokenizer-js,
// llama3-tokenizer-js, js-tiktoken:ENCODING), each without special tokens around the text. Prints
// one JSON array: per reference its name, load seconds, and the median round's encode and decode
// MB/s (of the text's bytes) and id count.
// Usage: node tokenize_reference.mjs <node_modules> <tokenizer.json> <text> <rounds> [package]
import fs from "fs";
import { createRequire } from "module";

const [modules, tokenizerPath, textPath, rounds, own] = process.argv.slice(2);
const bytes = fs.readFileSync(textPath);
const text = bytes.toString("utf8");

function median(work) {
  const seconds = [];
  let result;
  for (let r = 0; r < Number(rounds); ++r) {
    const start = process.hrtime.bigint();
    result = work();
    seconds.push(Number(process.hrtime.bigint() - start) / 1e9);
  }
  seconds.sort((a, b) => a - b);
  return [seconds[Math.floor(seconds.length / 2)], result];
}

async function timed(name, load) {
  const start = process.hrtime.bigint();
  const { encode, decode } = await load();
  const loadSeconds = Number(process.hrtime.bigint() - start) / 1e9;
  const [encodeSeconds, ids] = median(() => encode(text));
  const [decodeSeconds] = median(() => decode(ids));
  return { name, load_seconds: loadSeconds, ids: ids.length,
           megabytes_per_second: bytes.length / encodeSeconds / 1e6,
           decode_megabytes_per_second: bytes.length / decodeSeconds / 1e6 };
}

const out = [await timed("@huggingface/tokenizers", async () => {
  const { Tokenizer } = await import(`${modules}/@huggingface/tokenizers/dist/tokenizers.mjs`);
  const t = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerPath, "utf8")), {});
  return { encode: (s) => t.encode(s, { add_special_tokens: false }).ids,
           decode: (ids) => t.decode(ids, { skip_special_tokens: false }) };
})];
if (own === "gpt-3-encoder") {
  out.push(await timed(own, async () => {
    const e = createRequire(`${modules}/`)("gpt-3-encoder");
    return { encode: (s) => e.encode(s), decode: (ids) => e.decode(ids) };
  }));
} else if (own === "llama-tokenizer-js" || own === "mistral-tokenizer-js") {
  out.push(await timed(own, async () => {
    const file = own === "llama-tokenizer-js" ? "llama-tokenizer.js" : "mistral-tokenizer.js";
    const m = await import(`${modules}/${own}/${file}`);
    const t = m.LlamaTokenizer ? new m.LlamaTokenizer() : m.default;
    return { encode: (s) => t.encode(s, false, false), decode: (ids) => t.decode(ids, false) };
  }));
} else if (own === "llama3-tokenizer-js") {
  out.push(await timed(own, async () => {
    const t = (await import(`${modules}/llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js`)).default;
    return { encode: (s) => t.encode(s, { bos: false, eos: false }), decode: (ids) => t.decode(ids) };
  }));
} else if (own && own.startsWith("js-tiktoken:")) {
  out.push(await timed(own, async () => {
    const { Tiktoken } = await import(`${modules}/js-tiktoken/dist/lite.js`);
    const ranks = (await import(`${modules}/js-tiktoken/dist/ranks/${own.slice(12)}.js`)).default;
    const t = new Tiktoken(ranks);
    return { encode: (s) => t.encode(s, "all"), decode: (ids) => t.decode(ids) };
  }));
} else if (own) {
  throw new Error(`--package ${own} is not one the bench knows`);
}
console.log(JSON.stringify(out));
