#!/usr/bin/env bash
# Llama 3's and GPT-4's real vocabularies against their owners' packages. Usage: tiktoken.sh
# <meshtensor> <scratch dir for npm>. js-tiktoken's rank files (cl100k_base: GPT-4; o200k_base:
# GPT-4o; r50k_base and p50k_base: GPT-3) become tokenizer.json files by `tokenizer
# from-tiktoken`; Llama 3's vocabulary (llama3-tokenizer-js) becomes the tokenizer.json Meta
# publishes on the Hugging Face hub, and its original rank file (tokenizer.model), converted by
# from-tiktoken too. Each encodes 100 KB of the fortunes, code, a text of accents, combining
# marks, CJK, emoji and digits, whitespace runs, random runs of repeated symbols, the special
# tokens in a text and bytes that are not UTF-8 as Hugging Face's implementation (npm
# @huggingface/tokenizers) and the vocabulary's own package do; decoding gives every valid text
# back. A text of U+0085 and U+FEFF is compared with Hugging Face's implementation only: the
# JavaScript packages take JavaScript's \s (U+FEFF in, U+0085 out), tiktoken's and Hugging
# Face's Rust code Unicode's White_Space, as meshtensor does.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
scratch=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
modules=$(npm_packages "$scratch" @huggingface/tokenizers@0.2.0 \
  js-tiktoken@1.0.21 llama3-tokenizer-js@1.2.0)
here=$(dirname "$0")/../tokenize
files=(node "$here/tiktoken_files.mjs" "$modules")
reference=(node "$here/reference_encode.mjs" "$modules")

for encoding in cl100k_base o200k_base r50k_base p50k_base; do
  "${files[@]}" "$encoding" "$dir/$encoding.tiktoken"
  "$bin" tokenizer from-tiktoken --ranks "$dir/$encoding.tiktoken" --encoding "$encoding" \
    --out "$dir/$encoding.json"
done
"${files[@]}" llama3 "$dir/llama3.json"
"${files[@]}" llama3-ranks "$dir/llama3.tiktoken"
"$bin" tokenizer from-tiktoken --ranks "$dir/llama3.tiktoken" --encoding llama3 \
  --out "$dir/llama3_ranks.json"

/usr/bin/python3 - "$dir" <<'PY'
import pathlib, random, sys
out = pathlib.Path(sys.argv[1])
edge = ("Hello world, it's a test!  Ünïcödé e\u0301 a\u0308\u0301 中文字符 日本語のテキスト "
        "한국어 текст 🙂👍🏽👨‍👩‍👧\n\tend   of   line\n\n\n   \t\t x" + "supercalifragilistic" * 40 +
        " 12345678 3.14159 1,000,000 I'M YOU'RE 'll 'S tail\r\n\u00a0\u2003x\u3000y\u200bq "
        "def f(x):\n    return {'a': [1, 2]}  # ∑ ∫ → ≠ //path/to ---- ====\n")
(out / "edge.txt").write_text(edge)
(out / "spaces.txt").write_text("".join(" " * n + "x" + "\t" * (n % 5) + "\n" * (n % 3)
                                        for n in range(1, 80)))
random.seed(7)
runs = [" ", "  ", "\t", "\n", "x", "ab", "aba", "==", "--", "...", "0", "11", "123", "!!", "//",
        "**", "  \n", "é", "中"]
(out / "runs.txt").write_text("".join(random.choice(runs) * random.randint(1, 30)
                                      for _ in range(4000)))
(out / "special.txt").write_text("<|endoftext|>" + edge + "<|begin_of_text|><|eot_id|>x" +
                                 "<|start_header_id|>user<|end_header_id|>\n\nhi<|fim_prefix|>")
(out / "bad.txt").write_bytes(b"ok \xff\xfe bad \xc3( \xe2\x82 end \xed\xa0\x80 \xf0\x9f\x99")
(out / "whitespace.txt").write_text("a\u0085\u0085b \ufeff\ufeffc  \u0085 d\ufeff e\u0085")
PY
head -c 100000 /usr/share/games/fortunes/fortunes >"$dir/fortunes.txt"
cat "$(dirname "$0")"/../../src/tokenize/tokenizer.cpp >"$dir/code.txt"

for tokenizer in cl100k_base o200k_base r50k_base p50k_base llama3 llama3_ranks; do
  own=--${tokenizer%_ranks}
  for text in fortunes code edge spaces runs special bad whitespace; do
    refs=("${reference[@]}" "$dir/$tokenizer.json" "$dir/$text.txt")
    [ "$text" = whitespace ] || refs+=("$own")
    "${refs[@]}" >"$dir/reference"
    ours=$("$bin" tokenizer encode --tokenizer "$dir/$tokenizer.json" --json <"$dir/$text.txt")
    agree_with_references "$tokenizer on $text" "$ours" "$dir/reference"
    if [ "$text" != bad ]; then
      "$bin" tokenizer decode --tokenizer "$dir/$tokenizer.json" <<<"$ours" |
        cmp -s - "$dir/$text.txt" || fail "$tokenizer: decoding $text does not give its bytes back"
    fi
  done
done
echo "ok: decoding gives every valid text back byte for byte"

same "[128000,9906]" "$("$bin" tokenizer encode --tokenizer "$dir/llama3.json" --json <<<"Hello" | sed 's/,198\]/]/')" \
  "Llama 3 starts a text with <|begin_of_text|>"
same "Hello" "$("$bin" tokenizer decode --tokenizer "$dir/cl100k_base.json" <<<"[100256, 9906, 100270]")" \
  "ids between cl100k's special tokens (no token) decode to nothing"
same "Hello<|endoftext|>" "$("$bin" tokenizer decode --tokenizer "$dir/cl100k_base.json" <<<"[9906, 100257]")" \
  "a special token decodes to its text"

# A model on Llama 3's converted rank file (its bos template, tiktoken's merge rule): trained,
# exported and read back, it generates the same tokens; the export's tokenizer_config.json puts
# the bos first.
"$bin" train --tokenizer "$dir/llama3_ranks.json" --model llama:layers=1,heads=2,kv_heads=1,dim=16,context=16,tie=1 \
  --mode exact --batch 4 --steps 2 --seed 3 --eval-every 0 --save "$dir/ck" >/dev/null
"$bin" checkpoint export --format hf "$dir/ck" "$dir/hf" >/dev/null
generated() {
  "$bin" generate --checkpoint "$1" --prompt "Hello there" --temperature 1 --seed 4 \
    --max-new-tokens 6 --json --mode exact
}
same "$(generated "$dir/ck")" "$(generated "hf:$dir/hf")" "the export of a Llama 3 tokenizer model generates its tokens"
grep -q '"add_bos_token": true' "$dir/hf/tokenizer_config.json" || fail "the export does not add the bos"

printf 'QQ== 0\nQQ== 1\n' >"$dir/twice.tiktoken"
printf 'QQ== 0\nQg== x\n' >"$dir/rank.tiktoken"
printf 'Q!Q= 0\n' >"$dir/base64.tiktoken"
printf 'QQ== 0\nQg== 0\n' >"$dir/shared.tiktoken"
head -n 255 "$dir/cl100k_base.tiktoken" >"$dir/bytes.tiktoken"
out=$dir/out.json
expect 2 "line 2 'QQ== 1': its token appears on an earlier line" \
  "$bin" tokenizer from-tiktoken --ranks "$dir/twice.tiktoken" --out "$out"
expect 2 "line 2 'Qg== x': its rank is not a whole number" \
  "$bin" tokenizer from-tiktoken --ranks "$dir/rank.tiktoken" --out "$out"
expect 2 "line 1: character 1 is not base64" \
  "$bin" tokenizer from-tiktoken --ranks "$dir/base64.tiktoken" --out "$out"
expect 2 "rank 0 is given to two tokens" \
  "$bin" tokenizer from-tiktoken --ranks "$dir/shared.tiktoken" --out "$out"
expect 2 "the vocabulary lacks the symbol of byte" \
  "$bin" tokenizer from-tiktoken --ranks "$dir/bytes.tiktoken" --out "$out"
expect 2 "special token <|endoftext|> has id 5, the rank of" \
  "$bin" tokenizer from-tiktoken --ranks "$dir/cl100k_base.tiktoken" --special '<|endoftext|>=5' --out "$out"
expect 2 "tiktoken encoding 'gpt5' is not one meshtensor knows" \
  "$bin" tokenizer from-tiktoken --ranks "$dir/cl100k_base.tiktoken" --encoding gpt5 --out "$out"
expect 2 "--special 'x=' is not TEXT=ID" \
  "$bin" tokenizer from-tiktoken --ranks "$dir/cl100k_base.tiktoken" --special 'x=' --out "$out"
expect 2 "a tiktoken rank file, without its pattern and special tokens: convert it" \
  "$bin" tokenizer encode --tokenizer "$dir/cl100k_base.tiktoken" </dev/null
[ ! -e "$out" ] || fail "a refused conversion wrote $out"
echo "ok: malformed rank files exit 2 naming the problem"
