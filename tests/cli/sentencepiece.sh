#!/usr/bin/env bash
# SentencePiece-style BPE in tokenizer.json against the reference implementations. Usage:
# sentencepiece.sh <meshtensor> <scratch dir for npm>. Llama 2's and Mistral 7B's real
# vocabularies (npm llama-tokenizer-js and mistral-tokenizer-js) become tokenizer.json files as
# Hugging Face publishes them (a Prepend and Replace normalizer, byte fallback, fused unknown
# tokens, a template adding <s>); a variant with a Metaspace pre-tokenizer and decoder, and one
# without byte fallback (unknown tokens), besides. Each encodes 100 KB of the fortunes, a text of
# accents, combining marks, CJK, emoji, whitespace runs and digits, one with the special tokens
# in it and one of bytes that are not UTF-8 exactly as Hugging Face's implementation (npm
# @huggingface/tokenizers) does, and as the vocabulary's own package does where it knows the
# text. Decoding gives every valid text back; malformed files exit 2 naming the problem.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
scratch=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
modules=$(npm_packages "$scratch" @huggingface/tokenizers@0.2.0 \
  llama-tokenizer-js@1.2.2 mistral-tokenizer-js@1.0.0)
here=$(dirname "$0")/../tokenize
reference=(node "$here/reference_encode.mjs" "$modules")

node "$here/sentencepiece_json.mjs" "$modules" llama2 "$dir/llama2.json"
node "$here/sentencepiece_json.mjs" "$modules" mistral "$dir/mistral.json"
node "$here/sentencepiece_json.mjs" "$modules" llama2 "$dir/metaspace.json" --metaspace
/usr/bin/python3 - "$dir" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
tokenizer = json.loads((out / "llama2.json").read_text())
tokenizer["model"]["byte_fallback"] = False  # characters outside the vocabulary: <unk>, fused
(out / "unknown.json").write_text(json.dumps(tokenizer))
edge = ("Hello world, it's a test!  Ünïcödé e\u0301 a\u0308\u0301 中文字符 日本語のテキスト "
        "🙂👍🏽👨‍👩‍👧\n\tend   of   line\n\n\n   \t\t x" + "supercalifragilistic" * 40 +
        " 12345678 3.14159 I'M YOU'RE 'll tail\r\n\u00a0\u2003x\u3000y\u0085z\ufeffw\u200bq "
        "def f(x):\n    return {'a': [1, 2]}  # ∑ ∫ → ≠\n")
(out / "edge.txt").write_text(edge)
(out / "spaces.txt").write_text("   three spaces first, two last  ")
(out / "special.txt").write_text("<s>" + edge + "</s> <unk>x</s>")
(out / "bad.txt").write_bytes(b"ok \xff\xfe bad \xc3( \xe2\x82 end \xed\xa0\x80 \xf0\x9f\x99")
PY
head -c 100000 /usr/share/games/fortunes/fortunes >"$dir/fortunes.txt"
for tokenizer in llama2 mistral metaspace unknown; do
  for text in fortunes edge spaces special bad; do
    own=()
    if [ "$text" != special ]; then
      case $tokenizer in llama2 | mistral) own=(--"$tokenizer") ;; esac
    fi
    "${reference[@]}" "$dir/$tokenizer.json" "$dir/$text.txt" "${own[@]}" >"$dir/reference"
    ours=$("$bin" tokenizer encode --tokenizer "$dir/$tokenizer.json" --json <"$dir/$text.txt")
    agree_with_references "$tokenizer on $text" "$ours" "$dir/reference"
    # Decoding undoes encoding wherever Hugging Face's does: not for unknown characters, nor for a
    # Metaspace that prepends "first" to a text starting with a space, nor for the space Prepend
    # puts after a special token in the text, nor for invalid bytes.
    if [ "$text" != bad ] && [ "$text" != special ] && [ "$tokenizer" != unknown ] &&
      ! { [ "$tokenizer" = metaspace ] && [ "$text" = spaces ]; }; then
      "$bin" tokenizer decode --tokenizer "$dir/$tokenizer.json" <<<"$ours" |
        cmp -s - "$dir/$text.txt" || fail "$tokenizer: decoding $text does not give its bytes back"
    fi
  done
done
echo "ok: decoding gives every valid text back byte for byte"

same "[15043]" "$("$bin" tokenizer encode --tokenizer "$dir/llama2.json" --json --no-special-tokens <<<"Hello" | sed 's/,13\]/]/')" \
  "--no-special-tokens leaves <s> out"
same "<s> Hello" "$("$bin" tokenizer decode --tokenizer "$dir/llama2.json" <<<"[1, 1, 15043]")" \
  "decode drops the template's <s> and keeps one from the text"
same "Hello" "$("$bin" tokenizer decode --tokenizer "$dir/llama2.json" --skip-special-tokens <<<"[1, 1, 15043]")" \
  "--skip-special-tokens drops every special token"
same "é" "$("$bin" tokenizer decode --tokenizer "$dir/llama2.json" <<<"[1, 198, 172]")" \
  "byte-fallback tokens decode to their bytes"

/usr/bin/python3 - "$dir" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
base = json.loads((out / "llama2.json").read_text())
def variant(name, change):
    doc = json.loads(json.dumps(base))
    change(doc)
    (out / f"{name}.json").write_text(json.dumps(doc))
variant("wordpiece", lambda d: d["model"].update(type="WordPiece"))
variant("no_byte", lambda d: d["model"]["vocab"].pop("<0x41>"))
variant("unk", lambda d: d["model"].update(unk_token="<nope>"))
variant("merge", lambda d: d["model"]["merges"].append("▁qz xv"))
variant("meta", lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "__"}))
variant("ctc", lambda d: d.update(decoder={"type": "CTC"}))
variant("template", lambda d: d["post_processor"]["single"].insert(0, {"SpecialToken": {"id": "<x>"}}))
variant("unigram", lambda d: d.update(pre_tokenizer={"type": "Whitespace"}))
variant("huge", lambda d: d["model"]["vocab"].update({"▁huge": 2**62}))
PY
expect 2 "its model is not a BPE" "$bin" tokenizer encode --tokenizer "$dir/wordpiece.json" </dev/null
expect 2 "byte_fallback needs the 256 tokens <0x00> to <0xFF>: it lacks <0x41>" \
  "$bin" tokenizer encode --tokenizer "$dir/no_byte.json" </dev/null
expect 2 "unk_token\" '<nope>' is not in the vocabulary" \
  "$bin" tokenizer encode --tokenizer "$dir/unk.json" </dev/null
expect 2 "merge '▁qz xv' names a token the vocabulary lacks" \
  "$bin" tokenizer encode --tokenizer "$dir/merge.json" </dev/null
expect 2 "its replacement is not one character" \
  "$bin" tokenizer encode --tokenizer "$dir/meta.json" </dev/null
expect 2 "type 'CTC' is not one meshtensor computes" \
  "$bin" tokenizer encode --tokenizer "$dir/ctc.json" </dev/null
expect 2 "special token '<x>' has no ids" \
  "$bin" tokenizer encode --tokenizer "$dir/template.json" </dev/null
expect 2 "type 'Whitespace' is not one meshtensor computes" \
  "$bin" tokenizer encode --tokenizer "$dir/unigram.json" </dev/null
expect 2 "has id 4611686018427387904, past the largest vocabulary" \
  "$bin" tokenizer encode --tokenizer "$dir/huge.json" </dev/null
