// Encodes a file with the reference implementations: Hugging Face's own JavaScript port
// (@huggingface/tokenizers) for any tokenizer.json, with the special tokens its post-processor
// adds, and, when named, the vocabulary's own npm package as well: --gpt2 (gpt-3-encoder),
// --llama2 (llama-tokenizer-js) or --mistral (mistral-tokenizer-js), each with its defaults;
// --llama3 (llama3-tokenizer-js, with its bos and without its eos, as Llama 3's tokenizer.json
// does); --cl100k_base, --o200k_base, --r50k_base or --p50k_base (js-tiktoken, every special
// token allowed).
// Prints one JSON array of ids per implementation, one a line.
// Usage: node reference_encode.mjs <node_modules> <tokenizer.json> <text file> [--PACKAGE]
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const [modulesArg, tokenizerPath, textPath, own] = process.argv.slice(2);
const modules = path.resolve(modulesArg);
const { Tokenizer } = await import(`${modules}/@huggingface/tokenizers/dist/tokenizers.mjs`);
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerPath, "utf8")), {});
// Bytes that are not UTF-8 become U+FFFD here, as meshtensor documents for its input.
const text = fs.readFileSync(textPath, "utf8");
console.log(JSON.stringify(tokenizer.encode(text, { add_special_tokens: true }).ids));
if (own === "--gpt2") {
  const encoder = createRequire(`${modules}/`)("gpt-3-encoder");
  console.log(JSON.stringify(encoder.encode(text)));
} else if (own === "--llama2") {
  const { LlamaTokenizer } = await import(`${modules}/llama-tokenizer-js/llama-tokenizer.js`);
  console.log(JSON.stringify(new LlamaTokenizer().encode(text)));
} else if (own === "--mistral") {
  const mistral = (await import(`${modules}/mistral-tokenizer-js/mistral-tokenizer.js`)).default;
  console.log(JSON.stringify(mistral.encode(text)));
} else if (own === "--llama3") {
  const llama3 = (await import(`${modules}/llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js`)).default;
  console.log(JSON.stringify(llama3.encode(text, { bos: true, eos: false })));
} else if (own && own.endsWith("_base")) {
  const { Tiktoken } = await import(`${modules}/js-tiktoken/dist/lite.js`);
  const ranks = (await import(`${modules}/js-tiktoken/dist/ranks/${own.slice(2)}.js`)).default;
  console.log(JSON.stringify(new Tiktoken(ranks).encode(text, "all")));
}
