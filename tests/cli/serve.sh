#!/usr/bin/env bash
# `meshtensor serve` from outside, with the official OpenAI client and curl.
# Usage: serve.sh <meshtensor> <case> <scratch dir for npm> [mpirun command ...]
#   openai  the official client (npm `openai`, installed into the scratch dir when missing):
#           models, completions with logprobs equal to `generate --json`'s bits, streaming, the
#           same bits among 64 concurrent requests, errors, a wrong key; the same bits on a
#           tensor-parallel server, and after a restart (and on mpi when an mpirun command follows)
#   errors  curl: bad requests get their 4xx and an OpenAI error naming the field, 413, 401,
#           path tricks; the server keeps serving; SIGTERM drains a running stream and exits 0
#   reload  a newer checkpoint under the served root is loaded by POST /admin/reload and by
#           SIGHUP; a request running during a reload ends on the weights it started with
#   llama   curl: a tied Llama-family checkpoint served on tp 2 is `meshtensor-llama`, with its
#           architecture, and completes with `generate --json`'s tokens and log-probabilities
#   bpe     a model on byte-level BPE tokens: completions with generate's tokens and bits, text
#           and logprobs.tokens from the tokenizer, byte offsets, token-id prompts, a stop sequence
#           starting inside a token (non-streamed and streamed alike)
#   roles   a Hugging Face folder whose tokenizer_config.json adds a bos and whose
#           generation_config.json names end ids: completions stop at an end id (not part of the
#           choice) with generate's tokens; an echoed prompt starts with the bos, its text, token
#           and offset included; streamed alike
#   chat    /v1/chat/completions on a folder whose tokenizer_config.json holds a chat template:
#           the official client's chat.completions.create, streamed and not, gives `generate
#           --chat`'s tokens and bits, stops at an end id, counts the rendered prompt; a template's
#           raise_exception, bad messages, a model without a template and a template construct
#           the renderer refuses get errors naming them
#   edges   raw sockets (tests/serve/http_edges.py): streamed prompt scores, whole-text offsets,
#           the idle gauge, framing (overflowing numbers, two Content-Lengths, pipelining, 413
#           on headers), 1,000 idle and trickling connections, the connection limit;
#           --max-context
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
scratch=$3
shift 3
mpirun=("$@")
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

train() {  # train <root> <stop after step> [resume]
  "$bin" train --mode exact --model gpt:layers=2,heads=4,dim=32,context=64 --batch 8 \
    --steps 6 --stop-after "$2" --seed 4 --eval-every 0 --save "$1" ${3:+--resume "$1"} >/dev/null
}

# start_server <name> <options...>: starts a server on a free port; sets url_<name>, pid_<name>.
start_server() {
  local name=$1
  shift
  "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 1 300); do
    if grep -q 'listening on' "$dir/$name.out" 2>/dev/null; then
      printf -v "url_$name" '%s' "$(grep -o 'http://[0-9.:]*' "$dir/$name.out")"
      # The process to signal: the server's own (rank 0's under mpirun, which would report a
      # signal it forwarded as a failure); the job's to wait for.
      printf -v "pid_$name" '%s' "$(grep -o 'pid [0-9]*' "$dir/$name.out" | cut -d' ' -f2)"
      printf -v "job_$name" '%s' "$pid"
      return
    fi
    kill -0 "$pid" 2>/dev/null || fail "server $name did not start: $(cat "$dir/$name.err")"
    sleep 0.1
  done
  fail "server $name did not listen within 30 s"
}

# stop_server <name>: SIGTERM, which must drain and exit 0.
stop_server() {
  local pid_var="pid_$1" job_var="job_$1"
  kill -TERM "${!pid_var}"
  local status=0
  wait "${!job_var}" || status=$?
  [ "$status" -eq 0 ] || fail "server $1 exited $status after SIGTERM: $(cat "$dir/$1.err")"
  grep -q 'drained, exiting' "$dir/$1.out" || fail "server $1 did not say it drained"
}

# need_openai: the official client in the scratch dir (installed once), or exit 77.
need_openai() {
  command -v node >/dev/null || { echo "SKIPPED: node is not installed"; exit 77; }
  if [ ! -d "$scratch/node_modules/openai" ]; then
    mkdir -p "$scratch"
    npm install --prefix "$scratch" --no-audit --no-fund --silent openai@6 >/dev/null 2>&1 ||
      { echo "SKIPPED: cannot install the npm package openai into $scratch"; exit 77; }
  fi
}

train "$dir/ckpt" 3
serve=(serve --checkpoint "$dir/ckpt" --mode exact --port 0)

case $case_name in
chat)
  need_openai
  "$bin" tokenizer train --vocab 300 --special '<|im_start|>' --special '<|im_end|>' \
    --out "$dir/tok.json" >/dev/null
  "$bin" train --tokenizer "$dir/tok.json" --model llama:layers=2,heads=2,kv_heads=1,dim=32,context=96,tie=1 \
    --mode exact --batch 8 --steps 20 --seed 3 --save "$dir/ck" >/dev/null
  "$bin" checkpoint export --format hf "$dir/ck" "$dir/hf" >/dev/null
  /usr/bin/python3 - "$dir/hf" <<'PY'
import json, sys
path = sys.argv[1] + "/tokenizer_config.json"
c = json.load(open(path))
c["eos_token"] = "<|im_end|>"
c["chat_template"] = (
    "{%- if messages[0]['role'] == 'assistant' %}"
    "{{- raise_exception('Conversations must start with a user or system message') }}{%- endif %}"
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content | trim + '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
json.dump(c, open(path, "w"))
PY
  chatted() {
    "$bin" generate --checkpoint "hf:$dir/hf" --mode exact --chat --system "Be brief." \
      --prompt "Tell me a fortune. " --temperature 0.9 --seed 7 --max-new-tokens 24 --json
  }
  third=$(chatted | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["tokens"][2])')
  echo "{\"eos_token_id\": [299, $third]}" >"$dir/hf/generation_config.json"
  chatted >"$dir/generated"
  printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTell me a fortune.<|im_end|>\n<|im_start|>assistant\n' |
    "$bin" tokenizer encode --tokenizer "$dir/hf/tokenizer.json" --no-special-tokens --json \
    >"$dir/rendered"
  /usr/bin/python3 - "$dir/generated" "$dir/rendered" >"$dir/expected.json" <<'PY'
import json, sys
generated = json.load(open(sys.argv[1]))
rendered = json.load(open(sys.argv[2]))
assert generated["prompt_tokens"] == len(rendered), (generated["prompt_tokens"], len(rendered))
assert generated["finish_reason"] == "stop" and len(generated["tokens"]) == 3, generated
print(json.dumps({"model": "chatty", "generated": generated, "prompt_tokens": len(rendered),
                  "messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Tell me a fortune. "}],
                  "request": {"max_tokens": 24, "temperature": 0.9, "seed": 7}}))
PY
  echo "ok: generate --chat renders the template (the prompt is the hand-rendered text's tokens)"
  start_server chat "$bin" serve --checkpoint "hf:$dir/hf" --mode exact --port 0 --model-name chatty
  node "$(dirname "$0")/../serve/openai_chat.mjs" "$scratch/node_modules" "$url_chat" \
    "$dir/expected.json"
  post_chat() {  # post_chat <url> <body>: prints the status, then the body
    curl -s -o "$dir/body" -w '%{http_code}\n' -H 'Content-Type: application/json' \
      -d "$2" "$1/v1/chat/completions"
    cat "$dir/body"
  }
  post_chat "$url_chat" '{"messages": [{"role": "assistant", "content": "Hi"}]}' >"$dir/reply"
  grep -q '^400' "$dir/reply" && grep -q 'must start with a user or system message' "$dir/reply" ||
    fail "a template's raise_exception is not a 400 with its message: $(cat "$dir/reply")"
  post_chat "$url_chat" '{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}' \
    >"$dir/reply"
  grep -q '^400' "$dir/reply" && grep -q 'messages\[0\].content\[0\]' "$dir/reply" ||
    fail "an image part is not refused by name: $(cat "$dir/reply")"
  post_chat "$url_chat" \
    '{"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function"}]}' \
    >"$dir/reply"
  grep -q '^400' "$dir/reply" && grep -q "'tools' is not supported" "$dir/reply" ||
    fail "tools are not refused: $(cat "$dir/reply")"
  echo "ok: raise_exception, a non-text part and tools are 400s naming them"
  stop_server chat
  start_server plain "$bin" "${serve[@]}"
  post_chat "$url_plain" '{"messages": [{"role": "user", "content": "Hi"}]}' >"$dir/reply"
  grep -q '^400' "$dir/reply" && grep -q 'chat_template_missing' "$dir/reply" &&
    grep -q -- '--chat-template' "$dir/reply" ||
    fail "a model without a chat template: $(cat "$dir/reply")"
  stop_server plain
  printf '{%% macro turn(m) %%}{{ m.content }}{%% endmacro %%}' >"$dir/macro.jinja"
  expect 2 'macro.jinja.*macro' "$bin" serve --checkpoint "$dir/ckpt" --port 0 \
    --chat-template "$dir/macro.jinja"
  expect 2 'no chat template.*--chat-template' "$bin" generate --checkpoint "$dir/ckpt" \
    --chat --prompt Hi
  echo "ok: a model without a template and a refused construct are named"
  ;;
roles)
  "$bin" tokenizer train --vocab 300 --special '<|begin_of_text|>' --special '<|end_of_text|>' \
    --out "$dir/tok.json" >/dev/null
  "$bin" train --tokenizer "$dir/tok.json" --model llama:layers=2,heads=2,kv_heads=1,dim=32,context=32,tie=1 \
    --mode exact --batch 8 --steps 20 --seed 3 --save "$dir/ck" >/dev/null
  "$bin" checkpoint export --format hf "$dir/ck" "$dir/hf" >/dev/null
  generated() {
    "$bin" generate --checkpoint "hf:$dir/hf" --mode exact --prompt "The " --temperature 1 --seed 5 \
      --max-new-tokens 12 --json
  }
  /usr/bin/python3 - "$dir/hf" <<'PY'
import json, sys
path = sys.argv[1] + "/tokenizer_config.json"
c = json.load(open(path))
c.update(add_bos_token=True, bos_token="<|begin_of_text|>")
json.dump(c, open(path, "w"))
PY
  third=$(generated | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["tokens"][2])')
  echo "{\"eos_token_id\": [298, $third]}" >"$dir/hf/generation_config.json"
  generated >"$dir/generated"
  start_server roles "$bin" serve --checkpoint "hf:$dir/hf" --mode exact --port 0
  /usr/bin/python3 - "$url_roles" "$dir/generated" <<'PY' || fail "serving a folder's bos and eos"
import json, sys, urllib.request
url, generated = sys.argv[1:]
expected = json.load(open(generated))
assert expected["finish_reason"] == "stop" and len(expected["tokens"]) == 3, expected

def post(body):
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        data = response.read()
    if not body.get("stream"):
        return json.loads(data)["choices"][0]
    events = [line[6:] for line in data.decode().split("\n") if line.startswith("data: ")]
    chunks = [json.loads(e)["choices"][0] for e in events if e != "[DONE]"]
    return {"text": "".join(c["text"] for c in chunks),
            "token_ids": sum((c.get("token_ids") or [] for c in chunks), []),
            "finish_reason": chunks[-1]["finish_reason"]}

sampling = {"prompt": "The ", "max_tokens": 12, "temperature": 1, "seed": 5}
for stream in (False, True):
    choice = post({**sampling, "logprobs": 0, "stream": stream})
    assert choice["token_ids"] == expected["tokens"][:-1], (choice, expected)
    assert choice["finish_reason"] == "stop", choice
    assert choice["text"] == expected["text"], (choice["text"], expected["text"])
print("ok: the completion stops at an end id, which is not part of it (streamed alike)")
echoed = post({**sampling, "logprobs": 0, "echo": True})
bos = "<|begin_of_text|>"
assert echoed["text"] == bos + "The " + expected["text"], echoed["text"]
logprobs = echoed["logprobs"]
assert logprobs["tokens"][0] == bos and logprobs["token_logprobs"][0] is None, logprobs
assert logprobs["text_offset"][:2] == [0, len(bos)], logprobs["text_offset"]
print("ok: the echoed prompt starts with the bos: its text, token and offset")
PY
  stop_server roles
  ;;
llama)
  "$bin" train --mode exact --model llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,context=64,tie=1 \
    --batch 8 --steps 3 --seed 4 --eval-every 0 --save "$dir/llama" >/dev/null
  "$bin" generate --checkpoint "$dir/llama" --mode exact --prompt "The fortune" \
    --max-new-tokens 12 --temperature 0.9 --top-k 20 --seed 7 --json >"$dir/generated"
  start_server llama "$bin" serve --checkpoint "$dir/llama" --mode exact --port 0 --ranks 2
  curl -s "$url_llama/v1/models" >"$dir/models"
  grep -q '"id":"meshtensor-llama"' "$dir/models" && grep -q '"architecture":"llama:' "$dir/models" ||
    fail "models: $(cat "$dir/models")"
  curl -s "$url_llama/v1/completions" -H 'Content-Type: application/json' -d '{"model":
    "meshtensor-llama", "prompt": "The fortune", "max_tokens": 12, "temperature": 0.9,
    "top_k": 20, "seed": 7, "logprobs": 0}' >"$dir/completion"
  /usr/bin/python3 - "$dir/generated" "$dir/completion" <<'PY' || fail "$(cat "$dir/completion")"
import json, sys
generated = json.load(open(sys.argv[1]))
choice = json.load(open(sys.argv[2]))["choices"][0]
assert choice["token_ids"] == generated["tokens"], (choice["token_ids"], generated["tokens"])
assert choice["logprobs"]["token_logprobs"] == generated["logprobs"]
PY
  echo "ok: the Llama server on tp 2 completes with generate's bits"
  stop_server llama
  ;;
bpe)
  "$bin" tokenizer train --vocab 512 --out "$dir/tok.json" >/dev/null
  "$bin" train --mode exact --model gpt:layers=2,heads=4,dim=32,context=64 --tokenizer "$dir/tok.json" \
    --batch 8 --steps 30 --seed 4 --eval-every 0 --save "$dir/bpe" >/dev/null
  "$bin" generate --checkpoint "$dir/bpe" --mode exact --prompt "The fortune" \
    --max-new-tokens 16 --temperature 0.9 --top-k 20 --seed 7 --json >"$dir/generated"
  start_server bpe "$bin" serve --checkpoint "$dir/bpe" --mode exact --port 0
  /usr/bin/python3 - "$url_bpe" "$dir/generated" "$bin" "$dir/tok.json" <<'PY' || fail "serving BPE tokens"
import json, subprocess, sys, urllib.request
url, generated, binary, tokenizer = sys.argv[1:]
expected = json.load(open(generated))

def post(body, stream=False):
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        data = response.read()
    if not stream:
        return json.loads(data)
    events = [line[6:] for line in data.decode().split("\n") if line.startswith("data: ")]
    return [json.loads(e) for e in events if e != "[DONE]"]

def decode(ids):
    return subprocess.run([binary, "tokenizer", "decode", "--tokenizer", tokenizer],
                          input=json.dumps(ids).encode(), capture_output=True, check=True).stdout

sampling = {"max_tokens": 16, "temperature": 0.9, "top_k": 20, "seed": 7}
choice = post({"prompt": "The fortune", "logprobs": 1, **sampling})["choices"][0]
assert choice["token_ids"] == expected["tokens"], (choice["token_ids"], expected["tokens"])
assert choice["logprobs"]["token_logprobs"] == expected["logprobs"]
raw = decode(choice["token_ids"])
assert choice["text"] == raw.decode("utf-8", "replace"), (choice["text"], raw)
labels = choice["logprobs"]["tokens"]
for label, token in zip(labels, choice["token_ids"]):
    one = decode([token])
    assert label == (one.decode() if one.decode("utf-8", "replace") == one.decode("utf-8", "ignore")
                     else "bytes:" + "".join("\\x%02x" % b for b in one)), (label, one)
offsets = choice["logprobs"]["text_offset"]
assert offsets == [len(decode(choice["token_ids"][:i])) for i in range(len(offsets))], offsets
print("ok: text, token strings and byte offsets of BPE tokens")
prompt_ids = json.loads(subprocess.run([binary, "tokenizer", "encode", "--tokenizer", tokenizer,
                                        "--json"], input=b"The fortune", capture_output=True,
                                       check=True).stdout)
by_ids = post({"prompt": prompt_ids, **sampling})["choices"][0]
assert by_ids["token_ids"] == choice["token_ids"]
print("ok: a prompt of token ids is in the tokenizer's ids")
# A stop sequence that starts inside a token: the text ends right before it.
text = raw.decode("latin-1")
lengths = [len(decode([t])) for t in choice["token_ids"]]
boundaries = {sum(lengths[:k]) for k in range(len(lengths) + 1)}
start = next(i for i in range(1, len(text) - 2) if i not in boundaries and text[i].isalpha())
stop = text[start:start + 2]
cut = text.index(stop)
stopped = post({"prompt": "The fortune", "stop": [stop], **sampling})["choices"][0]
assert stopped["finish_reason"] == "stop", stopped
assert stopped["text"].encode() == raw[:cut], (stopped["text"], raw[:cut], stop)
chunks = post({"prompt": "The fortune", "stop": [stop], "stream": True, **sampling}, stream=True)
streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
assert streamed == stopped["text"], (streamed, stopped["text"])
ids = [t for c in chunks if c["choices"] for t in c["choices"][0]["token_ids"]]
assert ids == stopped["token_ids"], (ids, stopped["token_ids"])
print(f"ok: stop sequence {stop!r} inside a token cuts the text at byte {cut}, streamed alike")
PY
  stop_server bpe
  ;;
openai)
  need_openai
  "$bin" generate --checkpoint "$dir/ckpt" --mode exact --prompt "The fortune" \
    --max-new-tokens 12 --temperature 0.9 --top-k 20 --seed 7 --json >"$dir/generated"
  node -e '
    const g = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    console.log(JSON.stringify({request: {prompt: "The fortune", max_tokens: 12, temperature: 0.9,
      top_k: 20, seed: 7}, tokens: g.tokens, logprobs: g.logprobs}));' "$dir/generated" \
    >"$dir/expected.json"
  client=(node "$(dirname "$0")/../serve/openai_client.mjs" "$scratch/node_modules" )
  MESHTENSOR_API_KEY=sekrit start_server one "$bin" "${serve[@]}"
  start_server tp "$bin" "${serve[@]}" --ranks 2 --api-key sekrit
  "${client[@]}" "$url_one" sekrit "$dir/expected.json" "$url_tp"
  stop_server one
  stop_server tp
  # After a restart, the same bits (the client compares them with generate's again).
  start_server again "$bin" "${serve[@]}" --api-key sekrit
  if [ ${#mpirun[@]} -gt 0 ]; then
    start_server mpi "${mpirun[@]}" -np 2 "$bin" "${serve[@]}" --backend mpi --api-key sekrit
    "${client[@]}" "$url_again" sekrit "$dir/expected.json" "$url_mpi" | tail -3
    stop_server mpi
  else
    "${client[@]}" "$url_again" sekrit "$dir/expected.json" | tail -2
  fi
  stop_server again
  ;;
errors)
  start_server one "$bin" "${serve[@]}" --api-key sekrit --max-body-bytes 4096 --max-queue 8
  auth=(-H "Authorization: Bearer sekrit")
  # expect <status> <text in the body> <curl arguments...>
  expect() {
    local want=$1 text=$2
    shift 2
    local got
    got=$(curl -s -o "$dir/body" -w '%{http_code}' "$@")
    [ "$got" = "$want" ] || fail "status $got, not $want, for $*: $(cat "$dir/body")"
    grep -qF -- "$text" "$dir/body" || fail "no '$text' in the answer to $*: $(cat "$dir/body")"
    if [ "$want" -ge 400 ]; then
      grep -q '"error":{"message":' "$dir/body" || fail "not an OpenAI error for $*"
    fi
  }
  c="$url_one/v1/completions"
  expect 401 "didn't provide an API key" "$c" -d '{"prompt":"a"}'
  expect 401 "Incorrect API key" "$c" -H "Authorization: Bearer nope" -d '{"prompt":"a"}'
  expect 200 '"status":"ok"' "$url_one/health"
  expect 400 "not valid JSON" "${auth[@]}" "$c" -d '{"prompt": "a",'
  expect 400 "JSON object" "${auth[@]}" "$c" -d '"just a string"'
  expect 400 "'prompt' is required" "${auth[@]}" "$c" -d '{}'
  expect 400 '"param":"promt"' "${auth[@]}" "$c" -d '{"promt":"a"}'
  expect 400 "'max_tokens': 0 is less than 1" "${auth[@]}" "$c" -d '{"prompt":"a","max_tokens":0}'
  expect 400 "'max_tokens': -1" "${auth[@]}" "$c" -d '{"prompt":"a","max_tokens":-1}'
  expect 400 "context of 64" "${auth[@]}" "$c" -d '{"prompt":"a","max_tokens":99999999999}'
  expect 400 "'n': 1000000000" "${auth[@]}" "$c" -d '{"prompt":"a","n":1000000000}'
  expect 400 "must be a number" "${auth[@]}" "$c" -d '{"prompt":"a","temperature":[1]}'
  expect 400 "prompt 0 is 70 tokens" "${auth[@]}" "$c" \
    -d "{\"prompt\":\"$(printf 'x%.0s' $(seq 70))\"}"
  head -c 10000 /dev/zero | tr '\0' 'a' | sed 's/^/{"prompt":"/; s/$/"}/' >"$dir/big.json"
  expect 413 "larger than the server accepts" "${auth[@]}" "$c" --data-binary @"$dir/big.json"
  expect 404 "No endpoint" "${auth[@]}" "$url_one/v1/../../etc/passwd" --path-as-is
  expect 404 "No endpoint" "${auth[@]}" "$url_one//v1/completions" --path-as-is -d '{}'
  expect 404 "No endpoint" "${auth[@]}" "$url_one/v1/completions%00" --path-as-is -d '{}'
  expect 404 "does not exist" "${auth[@]}" "$url_one/v1/models/..%2f..%2fetc"
  expect 405 "use POST" "${auth[@]}" "$url_one/v1/completions"
  expect 411 "needs a Content-Length" "${auth[@]}" -X POST "$c"
  head -c 5000000 /dev/zero | tr '\0' 'a' >"$dir/zeros"
  expect 411 "needs a Content-Length" "${auth[@]}" -H "Transfer-Encoding: chunked" \
    --data-binary @"$dir/zeros" "$c"
  expect 400 "can never fit" "${auth[@]}" "$c" -d '{"prompt":"a","n":9}'
  expect 400 "chat_template_missing" "${auth[@]}" "$url_one/v1/chat/completions" -d '{}'
  expect 404 "model_not_found" "${auth[@]}" "$c" -d '{"prompt":"a","model":"gpt-4o"}'
  # Requests past the queue: some answer 429 with Retry-After, none fails otherwise.
  for i in $(seq 1 12); do
    curl -s -o /dev/null -D "$dir/headers.$i" -w '%{http_code}\n' "${auth[@]}" "$c" \
      -d '{"prompt":"a","n":4,"max_tokens":60}' >"$dir/status.$i" &
  done
  wait_for_clients() { for p in $(jobs -p); do [ "$p" = "$job_one" ] || wait "$p"; done; }
  wait_for_clients
  cat "$dir"/status.* | sort | uniq -c
  grep -qx 429 "$dir"/status.* || fail "a full queue never answered 429"
  ! grep -qvE '^(200|429)$' "$dir"/status.* || fail "statuses other than 200 and 429"
  grep -qi '^Retry-After: 1' $(grep -lx 429 "$dir"/status.* | sed 's/status/headers/') ||
    fail "429 without Retry-After"
  expect 200 '"finish_reason":"length"' "${auth[@]}" "$c" -d '{"prompt":"still","max_tokens":3}'
  # Bad command lines: a port in use, a missing checkpoint, another model's checkpoint.
  port=${url_one##*:}
  ck="--checkpoint $dir/ckpt"
  for bad in "$ck --port $port|cannot listen on 127.0.0.1 port $port" \
             "--checkpoint $dir/none|$dir/none" "$ck --port 70000|--port" \
             "$ck --mode native|native" "$ck --ranks 3|3" "$ck --host ::1x --port 0|::1x" \
             "$ck --host not_a_host --port 0|'not_a_host' is neither an address"; do
    set +e
    # shellcheck disable=SC2086
    "$bin" serve ${bad%%|*} >"$dir/bad.out" 2>&1
    status=$?
    set -e
    [ "$status" -eq 2 ] && grep -qF -- "${bad#*|}" "$dir/bad.out" ||
      fail "serve ${bad%%|*}: exit $status: $(cat "$dir/bad.out")"
  done
  # A key no header can carry is refused, naming the byte.
  set +e
  "$bin" serve --checkpoint "$dir/ckpt" --port 0 --api-key $'a\nb' >"$dir/bad.out" 2>&1
  status=$?
  set -e
  [ "$status" -eq 2 ] && grep -qF "control character 0x0a" "$dir/bad.out" ||
    fail "an API key with a newline: exit $status: $(cat "$dir/bad.out")"
  grep -q 'meshtensor_requests_total{endpoint="/v1/completions",status="400"}' \
    <(curl -s "$url_one/metrics") || fail "metrics do not count the 400s"
  # A client that disconnects frees its slot: one slot, a request of 8 x 400 tokens on a larger
  # model, the reader gone after 0.3 s; the next request is served at once.
  "$bin" train --model gpt:layers=2,heads=4,dim=256,context=512 --batch 2 --steps 1 \
    --eval-every 0 --save "$dir/big" >/dev/null
  start_server big "$bin" serve --checkpoint "$dir/big" --port 0 --max-batch 1
  curl -s --max-time 0.3 "$url_big/v1/completions" \
    -d '{"prompt":"a","n":8,"max_tokens":400,"stream":true}' >/dev/null || true
  sleep 0.3
  generated() { curl -s "$url_big/metrics" | grep '^meshtensor_generated_tokens_total' | cut -d' ' -f2; }
  before=$(generated)
  sleep 0.5
  [ "$(generated)" = "$before" ] || fail "generation went on after the client left"
  [ "$before" -lt 3200 ] || fail "all $before tokens were generated for a client that left"
  grep -q '^meshtensor_running_batch 0' <(curl -s "$url_big/metrics") || fail "slot not freed"
  stop_server big
  # SIGTERM during a stream: the stream ends with [DONE], new requests are refused, exit 0.
  curl -sN "${auth[@]}" "$c" -d '{"prompt":"a","n":8,"max_tokens":60,"stream":true}' \
    >"$dir/stream" &
  stream_pid=$!
  sleep 0.3
  kill -TERM "$pid_one"
  wait "$stream_pid"
  tail -1 "$dir/stream" | grep -q '^$' && grep -q '^data: \[DONE\]' "$dir/stream" ||
    fail "the stream did not end with [DONE]: $(tail -c 300 "$dir/stream")"
  [ "$(grep -c '"finish_reason":"length"' "$dir/stream")" -eq 8 ] ||
    fail "not every choice of the drained stream finished"
  status=0
  wait "$job_one" || status=$?
  [ "$status" -eq 0 ] || fail "exit status $status after SIGTERM"
  echo "ok: errors answered, the queue pushed back, SIGTERM drained"
  ;;
reload)
  # One slot and a write per step: a request of many choices runs long enough to straddle a
  # reload.
  serve=(serve --checkpoint "$dir/ckpt" --mode exact --port 0 --max-batch 1 --stream-interval-ms 0)
  start_server one "$bin" "${serve[@]}"
  c="$url_one/v1/completions"
  step_of() { grep -o '"weights_step":[0-9]*' | head -1 | cut -d: -f2; }
  [ "$(curl -s "$c" -d '{"prompt":"a","max_tokens":2}' | step_of)" = 3 ] || fail "not step 3"
  train "$dir/ckpt" 5 resume
  # A long stream started before the reload ends on step 3; requests after it get step 5.
  curl -sN "$c" -d '{"prompt":"a","n":64,"max_tokens":60,"stream":true}' >"$dir/stream" &
  stream_pid=$!
  until grep -q '^data: {' "$dir/stream" 2>/dev/null; do sleep 0.01; done
  ! grep -q 'DONE' "$dir/stream" || fail "the stream ended before the reload began"
  curl -s -d '' "$url_one/admin/reload" >"$dir/reloaded"
  grep -q '"weights_step":5' "$dir/reloaded" || fail "reload: $(cat "$dir/reloaded")"
  wait "$stream_pid"
  ! grep -o '"weights_step":[0-9]*' "$dir/stream" | grep -qv ':3$' ||
    fail "a stream running during the reload mixed weights"
  [ "$(grep -c '"finish_reason":"length"' "$dir/stream")" -eq 64 ] ||
    fail "the stream running during the reload did not finish its 64 choices"
  [ "$(curl -s "$c" -d '{"prompt":"a","max_tokens":2}' | step_of)" = 5 ] || fail "not step 5"
  grep -q '"weights_step":5' <(curl -s "$url_one/v1/models") || fail "models not at step 5"
  # SIGHUP reloads too.
  train "$dir/ckpt" 6 resume
  kill -HUP "$pid_one"
  for _ in $(seq 1 100); do
    [ "$(curl -s "$c" -d '{"prompt":"a","max_tokens":2}' | step_of)" = 6 ] && break
    sleep 0.1
  done
  [ "$(curl -s "$c" -d '{"prompt":"a","max_tokens":2}' | step_of)" = 6 ] || fail "SIGHUP: not 6"
  # A damaged newest checkpoint: the reload fails by name and the old weights stay.
  mkdir "$dir/ckpt/step-00000099"
  echo '{' >"$dir/ckpt/step-00000099/index.json"
  echo step-00000099 >"$dir/ckpt/LATEST"
  curl -s -o "$dir/failed" -w '%{http_code}' -d '' "$url_one/admin/reload" >"$dir/status"
  [ "$(cat "$dir/status")" = 422 ] && grep -q 'old weights are still served' "$dir/failed" ||
    fail "damaged reload: $(cat "$dir/status") $(cat "$dir/failed")"
  [ "$(curl -s "$c" -d '{"prompt":"a","max_tokens":2}' | step_of)" = 6 ] || fail "lost step 6"
  stop_server one
  echo "ok: reloads by endpoint and SIGHUP; in-flight requests kept their weights"
  ;;
edges)
  edges=(/usr/bin/python3 "$(dirname "$0")/../serve/http_edges.py")
  start_server one "$bin" "${serve[@]}" --prefill-chunk 8
  for part in stream_scores framing connections; do "${edges[@]}" "$part" "$url_one"; done
  stop_server one
  start_server few "$bin" "${serve[@]}" --max-connections 20
  "${edges[@]}" over_limit "$url_few" 20
  stop_server few  # --max-context: choices of up to 16 positions (caches of 16, not the model's 64).
  start_server short "$bin" "${serve[@]}" --max-context 16
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url_short/v1/completions" \
    -d '{"prompt":"abcd","max_tokens":12}')" = 200 ] || fail "a choice of 16 positions"
  curl -s "$url_short/v1/completions" -d '{"prompt":"abcd","max_tokens":13}' >"$dir/reply"
  grep -q "more than the model's context of 16" "$dir/reply" || fail "17 positions: $(cat "$dir/reply")"
  curl -s "$url_short/v1/models" | grep -q '"context":16' || fail "/v1/models: not context 16"
  stop_server short
  echo "ok: --max-context 16 serves choices of up to 16 positions"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
