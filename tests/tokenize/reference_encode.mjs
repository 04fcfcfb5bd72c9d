// Encodes a file with the reference implementations: Hugging Face's own JavaScript port
// (@huggingface/tokenizers) for any tokenizer.json, with the special tokens its post-processor
// adds, and, when named, the vocabulary's own npm package as well: --gpt2 (gpt-3-encoder),
// --llama2 (llama-tokenizer-js) or --mistral (mistral-tokenizer-js), each with its defaults.
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
}
