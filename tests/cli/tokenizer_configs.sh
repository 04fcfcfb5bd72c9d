#!/usr/bin/env bash
# A Hugging Face folder's tokenizer_config.json and generation_config.json from the command line.
# Usage: tokenizer_configs.sh <meshtensor> <case>
#   generate  add_bos_token puts the bos before a prompt (the same tokens as the bos written in
#             the prompt); generation ends at any eos_token_id (a list) and at the tokenizer's
#             eos_token, keeping the token and reporting "stop"; train --init hf:DIR keeps both in
#             its checkpoint and its export writes them back; bad configs exit 2 naming the field
#   rl        GRPO on a folder whose end ids its completions draw: completions end there, the
#             tokens after the end are not trained on, parity stays 100%
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$bin" tokenizer train --vocab 300 --special '<|begin_of_text|>' --special '<|end_of_text|>' \
  --special '<|eot_id|>' --out "$dir/tok.json" >/dev/null
"$bin" train --tokenizer "$dir/tok.json" --model llama:layers=2,heads=2,kv_heads=1,dim=32,context=32,tie=1 \
  --mode exact --batch 8 --steps 20 --seed 3 --save "$dir/ck" >/dev/null
"$bin" checkpoint export --format hf "$dir/ck" "$dir/hf" >/dev/null
[ -s "$dir/hf/tokenizer_config.json" ] || fail "the export wrote no tokenizer_config.json"

# config FILE PYTHON: edits the JSON file FILE of the folder (`c` is its object).
config() {
  /usr/bin/python3 - "$dir/hf/$1" "$2" <<'PY'
import json, sys
path, change = sys.argv[1], sys.argv[2]
c = json.load(open(path))
exec(change)
json.dump(c, open(path, "w"))
PY
}
# tokens PROMPT [options]: the tokens, text and finish reason of a seeded completion.
tokens() {
  local prompt=$1
  shift
  "$bin" generate --checkpoint "hf:$dir/hf" --prompt "$prompt" --temperature 1 --seed 5 \
    --max-new-tokens 12 --json "$@" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print(" ".join(map(str, d["tokens"])), "|", d["finish_reason"])'
}

case $case_name in
generate)
  plain=$(tokens "The ")
  config tokenizer_config.json 'c.update(add_bos_token=True, bos_token="<|begin_of_text|>")'
  with_bos=$(tokens "The ")
  config tokenizer_config.json 'c.update(add_bos_token=False)'
  same "$with_bos" "$(tokens "<|begin_of_text|>The ")" "add_bos_token: the bos before the prompt"
  [ "$with_bos" != "$plain" ] || fail "add_bos_token changed nothing"
  config tokenizer_config.json 'c.update(add_bos_token=True)'
  # The third token drawn becomes an end of sequence: the completion stops there.
  read -r -a drawn <<<"${with_bos% |*}"
  third=${drawn[2]}
  config generation_config.json "c.update(eos_token_id=[299, $third])"
  same "${drawn[0]} ${drawn[1]} $third | stop" "$(tokens "The ")" "eos_token_id ends the completion"
  config generation_config.json 'c.update(eos_token_id=None)'
  same "$with_bos" "$(tokens "The ")" "no eos_token_id: the whole completion"
  config generation_config.json "c.update(eos_token_id=$third)"
  same "${drawn[0]} ${drawn[1]} $third | stop" "$(tokens "The ")" "one eos_token_id ends it too"
  echo "ok: add_bos_token and eos_token_id as transformers and vLLM read them"

  "$bin" train --init "hf:$dir/hf" --mode exact --batch 8 --steps 2 --seed 3 --save "$dir/tuned" >/dev/null
  "$bin" checkpoint export --format hf "$dir/tuned" "$dir/again" >/dev/null
  /usr/bin/python3 - "$dir/again" "$third" <<'PY' || fail "the export of a train --init hf:DIR run lost its roles"
import json, sys
folder, third = sys.argv[1], int(sys.argv[2])
generation = json.load(open(f"{folder}/generation_config.json"))
tokenizer = json.load(open(f"{folder}/tokenizer_config.json"))
assert generation["eos_token_id"] == third, generation
assert generation["bos_token_id"] == 297, generation
assert tokenizer["add_bos_token"] is True and tokenizer["bos_token"] == "<|begin_of_text|>", tokenizer
assert tokenizer["added_tokens_decoder"]["299"]["content"] == "<|eot_id|>", tokenizer
PY
  "$bin" checkpoint export --format hf "hf:$dir/again" "$dir/third" >/dev/null
  diff -r "$dir/again" "$dir/third" >/dev/null || fail "exporting the export changed its bytes"
  echo "ok: train --init hf:DIR keeps the roles; its export writes them back, byte-stable"

  config tokenizer_config.json 'c.update(bos_token=None)'
  expect 2 'tokenizer_config.json: "add_bos_token" is true, but it names no bos_token' \
    "$bin" generate --checkpoint "hf:$dir/hf" --prompt a
  config tokenizer_config.json 'c.update(bos_token="<|nope|>")'
  expect 2 "tokenizer_config.json: bos_token '<|nope|>' is not in the tokenizer" \
    "$bin" generate --checkpoint "hf:$dir/hf" --prompt a
  config tokenizer_config.json 'c.update(bos_token={"content": "<|begin_of_text|>"}, add_eos_token="yes")'
  expect 2 'tokenizer_config.json: "add_eos_token" is "yes", not true or false' \
    "$bin" generate --checkpoint "hf:$dir/hf" --prompt a
  config tokenizer_config.json 'c.update(add_eos_token=False)'
  config generation_config.json 'c.update(eos_token_id=[5, 300])'
  expect 2 "generation_config.json: end-of-sequence id 300 names no token of the 300" \
    "$bin" generate --checkpoint "hf:$dir/hf" --prompt a
  config generation_config.json 'c.update(eos_token_id="2")'
  expect 2 'generation_config.json: "eos_token_id" is "2", not an id or a list of ids' \
    "$bin" generate --checkpoint "hf:$dir/hf" --prompt a
  rm "$dir/hf/generation_config.json"
  config config.json 'c.update(eos_token_id=-1)'
  expect 2 'config.json: "eos_token_id" is -1' "$bin" generate --checkpoint "hf:$dir/hf" --prompt a
  ;;
rl)
  # Each completion may end early at the end ids; parity still covers every token it drew.
  config generation_config.json 'c.update(eos_token_id=list(range(100, 200)))'
  out=$("$bin" rl --init "hf:$dir/hf" --steps 2 --prompts 2 --samples 4 --new-tokens 8 --mode exact --json)
  /usr/bin/python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.strip()]
final = lines[-1]
assert final["parity"]["identical"] == final["parity"]["tokens"] > 0, final["parity"]
assert final["parity"]["tokens"] < 2 * 2 * 4 * 8, ("no completion ended early", final["parity"])
print("ok: parity", final["parity"]["identical"], "of", final["parity"]["tokens"], "tokens drawn")' <<<"$out" ||
    fail "rl with end ids: $(tail -c 600 <<<"$out")"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
