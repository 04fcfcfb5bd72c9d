#!/usr/bin/env bash
# Models on byte-level BPE tokens from the command line. Usage: bpe.sh <meshtensor> <case>
#   trainer   `tokenizer train` is deterministic, ids 0-255 are the bytes and <|endoftext|> the
#             last; the merges reach the vocabulary asked for in well under the time goal
#   layouts   train --tokenizer: the vocabulary is the tokenizer's, validation bits per byte are
#             the loss over the bytes its targets stand for; one exact digest on 1 rank, fsdp x tp
#             with sequence parallelism and pp 2 (gpt), and tp 2 (llama)
#   checkpoint the checkpoint holds the tokenizer under its checksum; resuming with another
#             tokenizer (or bytes) is refused by name; a tp 2 checkpoint resumes on fsdp 2 to the
#             uninterrupted bits; a tampered tokenizer or one the architecture does not name is
#             refused by generate and verify
#   hf        checkpoint export --format hf of a tied GPT on BPE tokens: its files, bf16 shards
#             with an index; export of the export is the same bytes; train --init hf:DIR on tp 2
#             and on 1 rank give one digest; serve and rl take hf:DIR; an untied GPT, a bad
#             --shard-size and hostile folders (no config, a FIFO tokenizer, a shard outside the
#             folder, another vocabulary) are refused by name
#   generate  prompts are encoded and completions decoded by the checkpoint's tokenizer; tp 2
#             gives the 1-rank tokens; the trainer scores the generator's tokens exactly; rl
#             runs on the checkpoint's tokens with parity
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$bin" tokenizer train --vocab 512 --out "$dir/tok.json" >"$dir/trained"
gpt=gpt:layers=2,heads=2,dim=32,context=32
base=(train --tokenizer "$dir/tok.json" --mode exact --batch 12 --seed 4)
run=("${base[@]}" --steps 3)

case $case_name in
trainer)
  grep -q "trained 512 tokens (255 merges, 1 special)" "$dir/trained" || fail "$(cat "$dir/trained")"
  "$bin" tokenizer train --vocab 512 --out "$dir/again.json" >/dev/null
  cmp -s "$dir/tok.json" "$dir/again.json" || fail "two trainings on one text differ"
  echo "ok: the same text trains the same tokenizer.json"
  /usr/bin/python3 - "$dir/tok.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
vocab = t["model"]["vocab"]
assert len(vocab) == 511 and t["added_tokens"][0]["content"] == "<|endoftext|>"
assert t["added_tokens"][0]["id"] == 511 and t["added_tokens"][0]["special"]
assert vocab["A"] == 65 and vocab["Ġ"] == 32, "ids 0-255 are the bytes"
assert len(t["model"]["merges"]) == 255
assert t["model"]["merges"][0] == ["Ġ", "t"], t["model"]["merges"][:3]
PY
  echo "ok: bytes first, then merges by frequency, the special token last"
  out=$("$bin" tokenizer train --vocab 8192 --pattern llama3 --out "$dir/big.json")
  seconds=$(sed -n 's/.* in \([0-9.]*\) s$/\1/p' <<<"$out")
  grep -q "trained 8192 tokens" <<<"$out" || fail "$out"
  echo "ok: 8192 tokens with Llama 3's pattern in $seconds s (goal: 30 s)"
  ids=$(printf 'Where there is a will, there is a way.' | "$bin" tokenizer encode --tokenizer "$dir/big.json")
  [ "$(wc -w <<<"$ids")" -lt 15 ] || fail "a common sentence took $(wc -w <<<"$ids") tokens: $ids"
  echo "ok: a common sentence encodes to $(wc -w <<<"$ids") tokens"
  expect 2 "vocabulary 100 is outside \[257" "$bin" tokenizer train --vocab 100 --out "$dir/x.json"
  expect 2 "pattern 'gpt5' is not gpt2 or llama3" \
    "$bin" tokenizer train --pattern gpt5 --out "$dir/x.json"
  expect 2 "special token '<s>' is given twice" \
    "$bin" tokenizer train --special '<s>' --special '<s>' --out "$dir/x.json"
  [ ! -e "$dir/x.json" ] || fail "a refused training wrote its --out"
  ;;
layouts)
  out=$("$bin" "${run[@]}" --model "$gpt" --ranks 1)
  grep -q "tokenizer bpe:[0-9a-f]* of 512 tokens" <<<"$out" || fail "no tokenizer line: $out"
  grep -q "validation loss [0-9.]* ([0-9.]* bits per byte)" <<<"$out" || fail "no bits per byte: $out"
  "$bin" "${run[@]}" --model "$gpt" --ranks 1 --json | tail -1 >"$dir/result.json"
  /usr/bin/python3 - "$dir/result.json" <<'PY' || fail "bits per byte are not the loss over the bytes"
import json, math, sys
result = json.load(open(sys.argv[1]))
assert result["parameters"] == 512 * 32 * 2 + 512 + 32 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32
loss, bits = result["validation_loss"], result["validation_bits_per_byte"]
ratio = loss / math.log(2) / bits  # bytes per target token
assert 1.5 < ratio < 2.5, ratio  # 512 tokens: about 1.8 bytes each
PY
  "$bin" train --model "$gpt" --mode exact --batch 12 --seed 4 --steps 3 --ranks 1 --json | tail -1 |
    /usr/bin/python3 -c '
import json, math, sys
r = json.load(sys.stdin)
assert r["validation_bits_per_byte"] == r["validation_loss"] / math.log(2), r' ||
    fail "a byte model's bits per byte are not its loss in bits"
  echo "ok: the vocabulary is the tokenizer's; bits per byte = loss / ln 2 / bytes per token"
  reference=$(digests "$bin" "${run[@]}" --model "$gpt" --ranks 1)
  for layout in "4 --mesh 2x2 --names fsdp,tp --sequence-parallel" "2 --mesh 2 --names pp"; do
    read -r ranks options <<<"$layout"
    # shellcheck disable=SC2086
    same "$reference" "$(digests "$bin" "${run[@]}" --model "$gpt" $options)" "gpt $options"
  done
  llama=llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,context=32
  reference=$(digests "$bin" "${run[@]}" --model "$llama" --ranks 1)
  same "$reference" "$(digests "$bin" "${run[@]}" --model "$llama" --mesh 2 --names tp)" "llama tp 2"
  ;;
checkpoint)
  "$bin" "${base[@]}" --model "$gpt" --steps 4 --mesh 2 --names tp --stop-after 2 --save "$dir/ck" \
    >/dev/null
  inspect=$("$bin" checkpoint inspect "$dir/ck")
  name=$(sed -n 's/.*vocabulary=512 tokenizer=\(bpe:[0-9a-f]*\)$/\1/p' <<<"$inspect")
  [ -n "$name" ] || fail "the architecture names no BPE: $inspect"
  grep -q "tokenizer: [0-9]* bytes of text" <<<"$inspect" || fail "no tokenizer kept: $inspect"
  "$bin" checkpoint inspect "$dir/ck" --json | /usr/bin/python3 -c '
import json, sys
kept = json.loads(json.load(sys.stdin)["metadata"]["tokenizer"])
given = json.load(open(sys.argv[1]))
assert kept["model"]["vocab"] == given["model"]["vocab"]
assert kept["model"]["merges"] == given["model"]["merges"]' "$dir/tok.json"
  echo "ok: the checkpoint holds the tokenizer as $name"
  whole=$(digests "$bin" "${base[@]}" --model "$gpt" --steps 4 --ranks 1)
  resumed=$(digests "$bin" "${base[@]}" --model "$gpt" --steps 4 --mesh 2 --names fsdp --resume "$dir/ck")
  same "$whole" "$resumed" "tp 2 stopped at step 2, resumed on fsdp 2"
  "$bin" tokenizer train --vocab 512 --pattern llama3 --out "$dir/other.json" >/dev/null
  expect 2 "tokenizer=bpe:" "$bin" train --tokenizer "$dir/other.json" --model "$gpt" --steps 4 \
    --ranks 1 --resume "$dir/ck"
  expect 2 "tokenizer=bytes" "$bin" train --model "$gpt" --steps 4 --ranks 1 --resume "$dir/ck"
  index=$(ls "$dir"/ck/step-*/index.json | tail -1)
  /usr/bin/python3 - "$index" <<'PY'
import json, sys
index = json.load(open(sys.argv[1]))
index["version"] = 1  # no metadata checksum: the architecture's own checks must refuse it
del index["metadata_checksum"]
tokenizer = json.loads(index["metadata"]["tokenizer"])
tokenizer["model"]["merges"] = tokenizer["model"]["merges"][::-1]
index["metadata"]["tokenizer"] = json.dumps(tokenizer)
json.dump(index, open(sys.argv[1], "w"))
PY
  expect 2 "its tokenizer is bpe:[0-9a-f]* by its checksum, but its architecture names $name" \
    "$bin" generate --checkpoint "$dir/ck" --prompt "a"
  expect 1 "by its checksum" "$bin" checkpoint verify "$dir/ck"
  ;;
generate)
  "$bin" "${run[@]}" --model "$gpt" --ranks 1 --save "$dir/ck" >/dev/null
  prompt="Where there is a will"
  one=$("$bin" generate --checkpoint "$dir/ck" --mode exact --prompt "$prompt" --max-new-tokens 12 \
    --temperature 0.9 --seed 3 --json)
  two=$("$bin" generate --checkpoint "$dir/ck" --mode exact --prompt "$prompt" --max-new-tokens 12 \
    --temperature 0.9 --seed 3 --json --ranks 2)
  same "$one" "$two" "generate on tp 2"
  echo "$one" >"$dir/one.json"
  /usr/bin/python3 - "$dir/one.json" "$bin" "$dir/tok.json" <<'PY' || fail "generate does not speak the tokenizer's ids: $one"
import json, subprocess, sys
out = json.load(open(sys.argv[1]))
ids = out["tokens"]
assert len(ids) == 12 and max(ids) < 512 and any(i >= 256 for i in ids), ids
raw = subprocess.run([sys.argv[2], "tokenizer", "decode", "--tokenizer", sys.argv[3]],
                     input=json.dumps(ids).encode(), capture_output=True, check=True).stdout
# As generate prints text: a byte outside UTF-8 (or NUL) as U+FFFD, a control byte as \xNN.
shown = ""
for c in raw.decode("utf-8", "surrogateescape"):
    if 0xDC80 <= ord(c) <= 0xDCFF or c == "\0":
        shown += "\ufffd"
    elif (ord(c) < 0x20 or ord(c) == 0x7F) and c not in "\n\t":
        shown += "\\x%02x" % ord(c)
    else:
        shown += c
assert out["text"] == shown, (out["text"], shown)
PY
  echo "ok: generate's tokens are the tokenizer's and its text their bytes"
  out=$("$bin" "${run[@]}" --model "$gpt" --mesh 2 --names tp --verify-generator)
  grep -q "with the same log-probability bits, largest difference 0$" <<<"$out" ||
    fail "the trainer does not score the generator's tokens exactly: $(grep generator <<<"$out")"
  echo "ok: $(grep "generator check" <<<"$out")"
  out=$("$bin" rl --init "$dir/ck" --task words --steps 2 --prompts 2 --samples 2 --new-tokens 6 \
    --mode exact --json)
  /usr/bin/python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.strip()]
final = lines[-1]
assert final["parity"]["identical"] == final["parity"]["tokens"] > 0, final["parity"]' <<<"$out" ||
    fail "rl on BPE tokens: $(tail -c 600 <<<"$out")"
  echo "ok: rl on the checkpoint's tokens keeps parity"
  ;;
hf)
  tied=gpt:layers=2,heads=2,dim=32,context=32,tie=1
  "$bin" "${run[@]}" --model "$tied" --ranks 1 --save "$dir/ck" >/dev/null
  "$bin" checkpoint export --format hf "$dir/ck" "$dir/hf" | grep -q "as GPT2LMHeadModel" ||
    fail "no GPT2LMHeadModel export"
  for file in config.json generation_config.json tokenizer_config.json tokenizer.json model.safetensors; do
    [ -s "$dir/hf/$file" ] || fail "the export has no $file"
  done
  cmp -s "$dir/hf/tokenizer.json" <("$bin" checkpoint inspect "$dir/ck" --json |
    /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["metadata"]["tokenizer"])') ||
    fail "the exported tokenizer.json is not the checkpoint's"
  "$bin" checkpoint export --format hf "$dir/ck" "$dir/bf16" --dtype bf16 --shard-size 40KB >/dev/null
  [ -s "$dir/bf16/model.safetensors.index.json" ] && [ ! -e "$dir/bf16/model.safetensors" ] ||
    fail "a 40KB shard size wrote no shards"
  "$bin" checkpoint export --format hf "hf:$dir/bf16" "$dir/again" --dtype bf16 --shard-size 40KB >/dev/null
  diff -r "$dir/bf16" "$dir/again" >/dev/null || fail "exporting the export changed its bytes"
  echo "ok: files, bf16 shards with an index, export of the export byte for byte"
  one=$(digests "$bin" train --init "hf:$dir/hf" --mode exact --batch 12 --seed 4 --steps 3 --ranks 1)
  two=$(digests "$bin" train --init "hf:$dir/hf" --mode exact --batch 12 --seed 4 --steps 3 --mesh 2 --names tp)
  same "$one" "$two" "train --init hf:DIR on tp 2"
  ck=$(digests "$bin" train --init "$dir/ck" --mode exact --batch 12 --seed 4 --steps 3 --ranks 1)
  same "$one" "$ck" "train --init from the checkpoint the folder came from"
  expect 2 "brings its own model and tokenizer" "$bin" train --init "hf:$dir/hf" --model "$gpt" --steps 1
  "$bin" rl --init "hf:$dir/hf" --steps 1 --prompts 2 --samples 2 --new-tokens 4 | grep -q "parity: .* with the trainer's" ||
    fail "rl --init hf:DIR"
  echo "ok: rl starts from hf:DIR"
  expect 2 "train the GPT with tie=1 to export it" \
    "$bin" checkpoint export --format hf "$(mkdir -p "$dir/u" && "$bin" "${run[@]}" --model "$gpt" --ranks 1 --save "$dir/u/ck" >/dev/null && echo "$dir/u/ck")" "$dir/untied"
  [ ! -e "$dir/untied" ] || fail "a refused export wrote its folder"
  mkdir "$dir/users" && echo mine >"$dir/users/model-00001-of-00002.safetensors"
  expect 2 "users exists and is not an empty folder" \
    "$bin" checkpoint export --format hf "$dir/ck" "$dir/users"
  [ "$(cat "$dir/users/model-00001-of-00002.safetensors")" = mine ] ||
    fail "a refused export touched a file it did not write"
  "$bin" checkpoint export --format hf "$dir/ck" "$dir/slash/" >/dev/null
  [ -s "$dir/slash/model.safetensors" ] && [ -z "$(ls -A "$dir" | grep partial)" ] ||
    fail "an export into DIR/ left its staging folder"
  expect 2 "--shard-size '2XB' is not a size" \
    "$bin" checkpoint export --format hf "$dir/ck" "$dir/x" --shard-size 2XB
  expect 2 "--format 'onnx': the one export format is hf" \
    "$bin" checkpoint export --format onnx "$dir/ck" "$dir/x"
  cp -r "$dir/hf" "$dir/bad"
  rm "$dir/bad/config.json"
  expect 2 "config.json: cannot" "$bin" generate --checkpoint "hf:$dir/bad" --prompt a
  cp "$dir/hf/config.json" "$dir/bad/"
  rm "$dir/bad/tokenizer.json" && mkfifo "$dir/bad/tokenizer.json"
  expect 2 "not a regular file (it is a FIFO)" "$bin" generate --checkpoint "hf:$dir/bad" --prompt a
  rm "$dir/bad/tokenizer.json" && cp "$dir/tok.json" "$dir/bad/tokenizer.json"
  mv "$dir/bad/model.safetensors" "$dir/bad/model.keep"
  printf '{"weight_map": {"transformer.wte.weight": "../../etc/passwd"}}' \
    >"$dir/bad/model.safetensors.index.json"
  expect 2 "not a .safetensors file of the folder" "$bin" generate --checkpoint "hf:$dir/bad" --prompt a
  mv "$dir/bad/model.keep" "$dir/bad/model.safetensors"
  expect 2 "holds both model.safetensors and model.safetensors.index.json" \
    "$bin" generate --checkpoint "hf:$dir/bad" --prompt a
  rm "$dir/bad/model.safetensors.index.json"
  "$bin" tokenizer train --vocab 300 --out "$dir/bad/tokenizer.json" >/dev/null
  expect 2 "added_tokens_decoder gives id 511 to '<|endoftext|>', which the tokenizer has as id 299" \
    "$bin" generate --checkpoint "hf:$dir/bad" --prompt a
  rm "$dir/bad/tokenizer_config.json"
  # An embedding padded past the tokenizer (Qwen's): ids 300 to 511 decode to nothing.
  "$bin" generate --checkpoint "hf:$dir/bad" --prompt a --max-new-tokens 4 >/dev/null ||
    fail "a vocab_size above the tokenizer's tokens does not load"
  echo "ok: a vocab_size of 512 over a tokenizer of 300 tokens loads"
  "$bin" tokenizer train --vocab 600 --out "$dir/bad/tokenizer.json" >/dev/null
  expect 2 "vocab_size 512 is fewer than the 600 tokens of its tokenizer.json" \
    "$bin" generate --checkpoint "hf:$dir/bad" --prompt a
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
