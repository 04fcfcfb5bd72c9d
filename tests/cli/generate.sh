#!/usr/bin/env bash
# `meshtensor generate` from the command line. Usage: generate.sh <meshtensor> <case>
#   batch   a checkpoint trained on dp x fsdp x tp 2x2x2 in exact mode: a prompt's tokens and
#           log-probability bits are the same alone and among other prompts, at any chunk size
#   layouts the same checkpoint generates the same tokens and log-probability bits on 1 rank
#           and on tensor-parallel 2 and 4 (3 for a 6-head model) (and on 2 mpi processes when an mpirun command
#           follows the case), a batch of prompts at once
#   errors  bad input exits 2 naming the value, and prints no completion
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$bin" train --mode exact --model gpt:layers=2,heads=4,dim=32,context=24 --batch 8 --steps 3 \
  --seed 4 --mesh 2x2x2 --names dp,fsdp,tp --sequence-parallel --eval-every 0 --save "$dir/ckpt" \
  >/dev/null
gen=(generate --checkpoint "$dir/ckpt" --mode exact --max-new-tokens 8 --temperature 0.9 --top-k 20
     --seed 7 --json)
case $case_name in
batch)
  alone=$("$bin" "${gen[@]}" --prompt "Fortune")
  printf 'A\nlonger prompt\nFortune\nxy\n' >"$dir/prompts"
  for chunk in 1 3 64; do
    for batch in 1 2 16; do
      line=$("$bin" "${gen[@]}" --prompts "$dir/prompts" --prefill-chunk $chunk --max-batch $batch |
        sed -n 3p)
      if [ "$line" != "$alone" ]; then
        echo "FAILED: chunk $chunk batch $batch: $line, alone: $alone"
        exit 1
      fi
    done
  done
  echo "ok: $alone"
  ;;
layouts)
  printf 'The \nA fortune\nxyz\n' >"$dir/prompts"
  one=$("$bin" "${gen[@]}" --prompts "$dir/prompts")
  for layout in "--ranks 2" "--ranks 4" "--mesh 4 --names tp"; do
    # shellcheck disable=SC2086
    other=$("$bin" "${gen[@]}" --prompts "$dir/prompts" $layout)
    if [ "$other" != "$one" ]; then
      echo "FAILED: $layout: $other, 1 rank: $one"
      exit 1
    fi
    echo "ok: $layout"
  done
  # Three-way tensor parallelism where the heads allow it.
  "$bin" train --mode exact --model gpt:layers=1,heads=6,dim=24,context=16 --batch 6 --steps 2 \
    --mesh 2x3 --names fsdp,tp --sequence-parallel --eval-every 0 --save "$dir/six" >/dev/null
  six=(generate --checkpoint "$dir/six" --mode exact --max-new-tokens 6 --json --prompts "$dir/prompts")
  if [ "$("$bin" "${six[@]}" --ranks 3)" != "$("$bin" "${six[@]}")" ]; then
    echo "FAILED: 6 heads: tp 3 differs from 1 rank"
    exit 1
  fi
  echo "ok: 6 heads, tp 3"
  if [ $# -gt 2 ]; then
    shift 2
    other=$("$@" -np 2 "$bin" "${gen[@]}" --prompts "$dir/prompts" --backend mpi --ranks 2)
    if [ "$other" != "$one" ]; then
      echo "FAILED: mpi 2: $other, 1 rank: $one"
      exit 1
    fi
    echo "ok: mpi 2"
    # A layout that is not the mpi job's is refused, as train refuses it.
    set +e
    wrong=$("$@" -np 2 "$bin" "${gen[@]}" --prompts "$dir/prompts" --backend mpi --mesh 4 \
      --names tp 2>&1)
    status=$?
    set -e
    [ $status != 0 ] && grep -q "\-\-mesh 4 does not match the mpi job's 2 ranks" <<<"$wrong" ||
      { echo "FAILED: mpi 2 ran --mesh 4: exit $status: $wrong"; exit 1; }
    echo "ok: --mesh 4 on an mpi job of 2 is refused"
  fi
  ;;
errors)
  expect() {  # expect <text> <args...>: exit status 2 and <text> on stderr
    local text=$1
    shift
    set +e
    out=$("$bin" "$@" 2>"$dir/err")
    status=$?
    set -e
    if [ $status -ne 2 ] || ! grep -qF -- "$text" "$dir/err" || [ -n "$out" ]; then
      echo "FAILED: $* exited $status with '$(cat "$dir/err")' and output '$out'; expected '$text'"
      exit 1
    fi
    echo "ok: $text"
  }
  printf 'fine\n\nalso fine\n' >"$dir/empty"
  expect "request 1: the prompt is empty" "${gen[@]}" --prompts "$dir/empty"
  expect "a prompt of 20 tokens plus 8 new tokens is longer than the model's context of 24" \
    "${gen[@]}" --prompt "twenty bytes of text"
  expect "--max-new-tokens" "${gen[@]}" --prompt "a" --max-new-tokens 0
  expect "give --prompt TEXT or --prompts FILE" "${gen[@]}"
  expect "no checkpoint at" "${gen[@]/$dir\/ckpt/$dir/none}" --prompt "a"
  "$bin" train --model mlp:8 --steps 1 --save "$dir/mlp" >/dev/null
  expect "is not a decoder's" generate --checkpoint "$dir/mlp" --prompt "a"
  cp -r "$dir/ckpt" "$dir/damaged"
  index=$(ls "$dir"/damaged/step-*/index.json | tail -1)
  cp "$index" "$dir/index.good"
  # set_architecture TEXT [old]: edits the metadata; "old" also makes it a version 1 index,
  # whose metadata has no checksum, so that the architecture's own checks are what refuse it.
  set_architecture() {
    python3 - "$index" "$dir/index.good" "$@" <<'PY'
import json, sys
index = json.load(open(sys.argv[2]))
index["metadata"]["architecture"] = sys.argv[3]
if len(sys.argv) > 4:
    index["version"] = 1
    del index["metadata_checksum"]
json.dump(index, open(sys.argv[1], "w"))
PY
  }
  set_architecture "gpt layers=2 heads=4 dim=32 context=64 vocabulary=256 tokenizer=bytes"
  expect "the metadata does not match its checksum" generate --checkpoint "$dir/damaged" --prompt a
  set_architecture "gpt layers=2 heads=4 dim=32 context=24 vocabulary=99999999999 tokenizer=bytes" old
  expect "vocabulary 99999999999 is more than 16777216" generate --checkpoint "$dir/damaged" --prompt a
  set_architecture "gpt layers=2 heads=4 dim=32 context=24 vocabulary=256 tokenizer=bpe:0123456789abcdef" old
  expect "names the tokenizer bpe:0123456789abcdef, but it holds none" \
    generate --checkpoint "$dir/damaged" --prompt a
  set_architecture "gpt layers=2 heads=4 dim=32 context=24 vocabulary=256 tokenizer=unigram" old
  expect "its tokenizer 'unigram' is neither bytes nor bpe:<checksum>" \
    generate --checkpoint "$dir/damaged" --prompt a
  set_architecture "gpt layers=256 heads=4 dim=8192 context=24 vocabulary=256 tokenizer=bytes" old
  expect "has 206190100736 parameters, but its 30 model tensor(s) hold 42880" \
    generate --checkpoint "$dir/damaged" --prompt a
  expect "has 206190100736 parameters, but its 30 model tensor(s) hold 42880" \
    bench generate --checkpoint "$dir/damaged"
  set +e
  verified=$("$bin" checkpoint verify "$dir/damaged")
  status=$?
  set -e
  [ $status = 1 ] && grep -qF "model tensor(s) hold" <<<"$verified" ||
    { echo "FAILED: verify passed an architecture that is not the tensors': $verified"; exit 1; }
  echo "ok: verify names the architecture that is not the tensors'"
  set_architecture "gpt layers=2 heads=4 dim=32 context=64 vocabulary=256 tokenizer=bytes"
  set +e
  verified=$("$bin" checkpoint verify "$dir/damaged" 2>&1)
  status=$?
  set -e
  [ $status = 2 ] && grep -qF "does not match its checksum" <<<"$verified" ||
    { echo "FAILED: verify passed edited metadata: $verified"; exit 1; }
  echo "ok: verify refuses edited metadata"
  echo '{"version": [[[[[[[[' >"$index"
  expect "is not a checkpoint index" generate --checkpoint "$dir/damaged" --prompt a
  expect "tensor-parallel degree 3 does not divide the model's 4 heads" "${gen[@]}" --prompt "a" \
    --ranks 3
  expect "--names must be tp, got 'dp'" "${gen[@]}" --prompt "a" --mesh 2 --names dp
  expect "--mode native: generation runs in ordered or exact mode" generate --checkpoint \
    "$dir/ckpt" --prompt a --mode native
  # Hostile prompt files: an endless line, a directory, a FIFO in place of the index.
  expect "--prompts /dev/zero: line 1 is longer than 1048576 bytes" "${gen[@]}" --prompts /dev/zero
  expect "--prompts $dir: is a directory, not a file of prompts" "${gen[@]}" --prompts "$dir"
  cp -r "$dir/ckpt" "$dir/fifo"
  index=$(ls "$dir"/fifo/step-*/index.json | tail -1)
  rm "$index" && mkfifo "$index"
  expect "it is a FIFO, not a regular file" generate --checkpoint "$dir/fifo" --prompt a
  # A layout the model refuses is named before any rank starts (4096 ranks would take long).
  expect "tensor-parallel degree 4096 does not divide the model's 4 heads" "${gen[@]}" \
    --prompt a --ranks 4096
  # Results stream: the first window prints while the prompt pipe is still open.
  set +e
  streamed=$({ for _ in $(seq 70); do echo a; done; sleep 20; } |
    timeout 10 "$bin" "${gen[@]}" --prompts /dev/stdin --max-batch 16)
  set -e
  grep -q '"prompt":"a"' <<<"$streamed" ||
    { echo "FAILED: nothing printed before the prompts ended"; exit 1; }
  echo "ok: $(wc -l <<<"$streamed") completions printed before the prompt pipe closed"
  ;;
*)
  echo "unknown case $case_name"
  exit 2
  ;;
esac
