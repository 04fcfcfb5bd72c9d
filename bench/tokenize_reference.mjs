// Times Hugging Face's own JavaScript tokenizer (npm @huggingface/tokenizers) encoding a text, for
// `meshtensor bench tokenize --reference`: prints {"megabytes_per_second", "ids"} of the median
// round. Usage: node tokenize_reference.mjs <node_modules> <tokenizer.json> <text> <rounds>
import fs from "fs";

const [modules, tokenizerPath, textPath, rounds] = process.argv.slice(2);
const { Tokenizer } = await import(`${modules}/@huggingface/tokenizers/dist/tokenizers.mjs`);
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerPath, "utf8")), {});
const bytes = fs.readFileSync(textPath);
const text = bytes.toString("utf8");
const seconds = [];
let ids = 0;
for (let r = 0; r < Number(rounds); ++r) {
  const start = process.hrtime.bigint();
  ids = tokenizer.encode(text, { add_special_tokens: false }).ids.length;
  seconds.push(Number(process.hrtime.bigint() - start) / 1e9);
}
seconds.sort((a, b) => a - b);
const median = seconds[Math.floor(seconds.length / 2)];
console.log(JSON.stringify({ megabytes_per_second: bytes.length / median / 1e6, ids }));
