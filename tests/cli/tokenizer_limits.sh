#!/usr/bin/env bash
# `meshtensor tokenizer` at the edges of its input. Usage: tokenizer_limits.sh <meshtensor> <case>
#   added     added tokens in linear time: 200,000 repeats of x<|endoftext|> with two added
#             tokens, 20 specials over 400 KB, 256 added tokens as Llama 3 has (each id where it
#             belongs); training with 20 specials
#   long      one 1 MB word encodes and decodes back; 100 MB of spaces peaks below 4x the input
#   options   --special is one verbatim token, valid UTF-8 checked before training; --vocab is
#             decimal; from-gpt2 refuses to overwrite an input; decode names an id past 2^63;
#             added_tokens that is not a list is refused
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

specials=()
for i in $(seq 0 19); do specials+=(--special "<|special_$i|>"); done

case $case_name in
added)
  "$bin" tokenizer train --vocab 400 --special '<|endoftext|>' --special '<|pad|>' \
    --out "$dir/two.json" >/dev/null
  /usr/bin/python3 -c 'import sys; sys.stdout.write("x<|endoftext|>" * 200000)' >"$dir/repeats.txt"
  ids=$("$bin" tokenizer encode --tokenizer "$dir/two.json" <"$dir/repeats.txt")
  [ "$(tr ' ' '\n' <<<"$ids" | grep -cx 398)" = 200000 ] ||
    fail "200,000 x<|endoftext|>: not 200,000 special ids"
  echo "ok: 200,000 repeats with two added tokens"
  "$bin" tokenizer train --vocab 600 "${specials[@]}" --out "$dir/twenty.json" >/dev/null
  /usr/bin/python3 - "$dir" <<'PY'
import json, pathlib, random, sys
out = pathlib.Path(sys.argv[1])
random.seed(5)
words = ["the", "cat", "sat", "<|special_3|>", "<|special_19|>", "on", "<|special_1", "mat"]
(out / "mixed.txt").write_text(" ".join(random.choice(words) for _ in range(100000)))
tokenizer = json.loads((out / "two.json").read_text())
first = len(tokenizer["model"]["vocab"])
tokenizer["added_tokens"] = [
    {"id": first + i, "content": f"<|reserved_special_token_{i}|>", "special": True}
    for i in range(256)]
(out / "many.json").write_text(json.dumps(tokenizer))
(out / "many.txt").write_text("".join(f"a<|reserved_special_token_{i % 256}|>" for i in range(50000)))
PY
  "$bin" tokenizer encode --tokenizer "$dir/twenty.json" --json <"$dir/mixed.txt" >"$dir/mixed.ids"
  /usr/bin/python3 - "$dir" <<'PY' || fail "20 specials over 400 KB"
import json, sys
text = open(sys.argv[1] + "/mixed.txt").read()
ids = json.load(open(sys.argv[1] + "/mixed.ids"))
tokenizer = json.load(open(sys.argv[1] + "/twenty.json"))
special = {t["id"]: t["content"] for t in tokenizer["added_tokens"]}
for content in ("<|special_3|>", "<|special_19|>"):
    token = next(i for i, c in special.items() if c == content)
    assert ids.count(token) == text.count(content), content
assert "<|special_1" not in {special.get(i) for i in ids}
PY
  echo "ok: 20 specials over 400 KB"
  "$bin" tokenizer encode --tokenizer "$dir/many.json" --json <"$dir/many.txt" >"$dir/many.ids"
  /usr/bin/python3 -c '
import json, sys
ids, first = json.load(open(sys.argv[1])), int(sys.argv[2])
expected = [i for n in range(50000) for i in (ord("a"), first + n % 256)]
assert ids == expected, ids[:8]' "$dir/many.ids" 398 || fail "256 added tokens"
  echo "ok: 256 added tokens, each id in its place"
  ;;
long)
  "$bin" tokenizer train --vocab 400 --out "$dir/t.json" >/dev/null
  /usr/bin/python3 -c 'import sys; sys.stdout.write("tha" * 333334)' >"$dir/word.txt"
  "$bin" tokenizer encode --tokenizer "$dir/t.json" <"$dir/word.txt" >"$dir/word.ids"
  "$bin" tokenizer decode --tokenizer "$dir/t.json" <"$dir/word.ids" | cmp -s - "$dir/word.txt" ||
    fail "a 1 MB word does not decode back"
  echo "ok: a 1 MB word encodes and decodes back"
  head -c 100000000 /dev/zero | tr '\0' ' ' >"$dir/spaces.txt"
  peak=$( { /usr/bin/time -f "%M" "$bin" tokenizer encode --tokenizer "$dir/t.json" \
    <"$dir/spaces.txt" >/dev/null; } 2>&1 | tail -1)
  if ldd "$bin" | grep -q 'libasan\|libtsan'; then
    # A sanitizer's allocator keeps freed blocks and redzones of its own: no bound to hold.
    echo "ok: 100 MB of spaces peaked at $peak KiB (a sanitizer build: not bounded)"
  else
    [ "$peak" -lt 400000 ] || fail "100 MB of spaces peaked at $peak KiB (4x the input is 390,625)"
    echo "ok: 100 MB of spaces peaked at $peak KiB"
  fi
  ;;
options)
  "$bin" tokenizer train --vocab 0500 --special '[SEP]' --special '[CLS,X]' --out "$dir/t.json" >/dev/null
  /usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
assert [a["content"] for a in t["added_tokens"]] == ["[SEP]", "[CLS,X]"], t["added_tokens"]
assert len(t["model"]["vocab"]) + 2 == 500' "$dir/t.json" || fail "--special or --vocab 0500"
  sep=$("$bin" tokenizer encode --tokenizer "$dir/t.json" <<<"[SEP]" | cut -d' ' -f1)
  plain=$("$bin" tokenizer encode --tokenizer "$dir/t.json" <<<"SEP")
  [ "$sep" = 498 ] && [[ " $plain " != *" 498 "* ]] || fail "[SEP]: $sep, SEP: $plain"
  echo "ok: --special is verbatim, --vocab decimal"
  expect 2 "special token .*\\\\xff\\\\xfe.* is not valid UTF-8" \
    "$bin" tokenizer train --vocab 300 --special $'\xff\xfe' --out "$dir/u.json"
  [ ! -e "$dir/u.json" ] || fail "a refused special wrote its file"
  expect 2 "--vocab: '0x12c' is not a non-negative integer" "$bin" tokenizer train --vocab 0x12c --out "$dir/u.json"
  /usr/bin/python3 - "$dir" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
encoder = json.loads((out / "t.json").read_text())["model"]["vocab"]
(out / "encoder.json").write_text(json.dumps(encoder))
(out / "vocab.bpe").write_text("#version: 0.2\n")
PY
  cp "$dir/vocab.bpe" "$dir/vocab.keep"
  expect 2 "--out .* is the file of --merges" "$bin" tokenizer from-gpt2 --encoder "$dir/encoder.json" \
    --merges "$dir/vocab.bpe" --out "$dir/vocab.bpe"
  expect 2 "--out .* is the file of --encoder" "$bin" tokenizer from-gpt2 --encoder "$dir/encoder.json" \
    --merges "$dir/vocab.bpe" --out "$dir/encoder.json"
  cmp -s "$dir/vocab.bpe" "$dir/vocab.keep" || fail "from-gpt2 changed its input"
  expect 2 "18446744073709551615 is not a token id" \
    "$bin" tokenizer decode --tokenizer "$dir/t.json" <<<"[1, 18446744073709551615]"
  /usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
t["added_tokens"] = {"[SEP]": 498}
json.dump(t, open(sys.argv[2], "w"))' "$dir/t.json" "$dir/object.json"
  expect 2 "added_tokens is an object of 1 key(s), not a list" "$bin" tokenizer encode --tokenizer "$dir/object.json" </dev/null
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
