// Encodes a file with the reference implementations: Hugging Face's own JavaScript port
// (@huggingface/tokenizers) for any tokenizer.json, and, with --gpt2, the npm gpt-3-encoder
// package as well. Prints one JSON array of ids per implementation, one a line.
// Usage: node reference_encode.mjs <node_modules> <tokenizer.json> <text file> [--gpt2]
import fs from "fs";
import { createRequire } from "module";

const [modules, tokenizerPath, textPath, gpt2] = process.argv.slice(2);
const { Tokenizer } = await import(`${modules}/@huggingface/tokenizers/dist/tokenizers.mjs`);
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerPath, "utf8")), {});
// Bytes that are not UTF-8 become U+FFFD here, as meshtensor documents for its input.
const text = fs.readFileSync(textPath, "utf8");
console.log(JSON.stringify(tokenizer.encode(text, { add_special_tokens: false }).ids));
if (gpt2 === "--gpt2") {
  const encoder = createRequire(`${modules}/`)("gpt-3-encoder");
  console.log(JSON.stringify(encoder.encode(text)));
}
