#!/usr/bin/env bash
# `meshtensor rl` from the command line. Usage: rl.sh <meshtensor> <case> [mpirun command ...]
#   layouts  exact mode: the same weights digest, and every generated token's log-probability
#            the trainer's bits, for trainer layouts 1 rank, fsdp 4, fsdp x tp 2x2 with sequence
#            parallelism (and fsdp on 2 mpi processes when an mpirun command follows the case),
#            each with the generator on 1 rank and on tp 2
#   resume   a run saved on one pair of layouts and resumed on another ends on the digest of
#            the run never stopped; ordered mode reports parity without stopping
#   errors   bad input exits 2 naming the value, and loses nothing
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$bin" train --mode exact --model gpt:layers=2,heads=4,dim=32,context=32 --batch 8 --steps 3 \
  --seed 4 --strategy fsdp --ranks 2 --eval-every 0 --save "$dir/ckpt" >/dev/null
rl=(rl --init "$dir/ckpt" --prompts 3 --samples 3 --new-tokens 8
    --prompt-bytes 12 --kl 0.05 --lr 1e-3 --seed 5 --json)

digest_of() { grep -o '"weights_digest":"[0-9a-f]*"' <<<"$1"; }
# The parity of a run's JSON: every compared token identical, and 3 steps x 9 completions x 8.
check_parity() {
  if ! grep -q '"parity":{"identical":216,"max_abs_diff":0.0,"tokens":216}' <<<"$2"; then
    echo "FAILED: $1: parity $(grep -o '"parity":{[^}]*}' <<<"$2")"
    exit 1
  fi
}

case $case_name in
layouts)
  rl+=(--steps 3 --mode exact)
  one=$("$bin" "${rl[@]}" --ranks 1)
  check_parity "1 rank" "$one"
  want=$(digest_of "$one")
  # The whole model's scalars (2 blocks of 12 tensors, embeddings, final norm and head).
  grep -q '"parameter_tensors":30,"parameters":43136' <<<"$one" ||
    { echo "FAILED: parameter count: $(grep -o '"parameter[^,]*,"parameters":[0-9]*' <<<"$one")"; exit 1; }
  for trainer in "--ranks 1" "--strategy fsdp --ranks 4" \
                 "--mesh 2x2 --names fsdp,tp --sequence-parallel"; do
    for generator in "--generator-mesh 1 --generator-names dp" "--generator-mesh 2 --generator-names tp"; do
      # shellcheck disable=SC2086
      out=$("$bin" "${rl[@]}" $trainer $generator)
      check_parity "$trainer / $generator" "$out"
      if [ "$(digest_of "$out")" != "$want" ]; then
        echo "FAILED: $trainer / $generator: $(digest_of "$out"), 1 rank: $want"
        exit 1
      fi
      echo "ok: $trainer / $generator"
    done
  done
  if [ $# -gt 2 ]; then
    shift 2
    # Without --ranks the trainer takes the whole job; a one-dim generator mesh is its tp degree.
    for generator in "--generator-mesh 1" "--generator-mesh 2"; do
      # shellcheck disable=SC2086
      out=$("$@" -np 2 "$bin" "${rl[@]}" --backend mpi --strategy fsdp $generator)
      check_parity "mpi fsdp 2 / $generator" "$out"
      if [ "$(digest_of "$out")" != "$want" ]; then
        echo "FAILED: mpi fsdp 2 / $generator: $(digest_of "$out"), 1 rank: $want"
        exit 1
      fi
      echo "ok: mpi fsdp 2 / $generator"
    done
  fi
  ;;
resume)
  # exact is the default mode
  whole=$("$bin" "${rl[@]}" --steps 4 --ranks 1)
  "$bin" "${rl[@]}" --steps 4 --stop-after 2 --strategy fsdp --ranks 2 \
    --generator-mesh 2 --generator-names tp --save "$dir/rl" >/dev/null
  resumed=$("$bin" "${rl[@]}" --steps 4 --mesh 2x2 --names fsdp,tp --resume "$dir/rl" \
    --generator-mesh 2x2 --generator-names dp,tp)
  if [ "$(digest_of "$resumed")" != "$(digest_of "$whole")" ]; then
    echo "FAILED: resumed $(digest_of "$resumed"), uninterrupted $(digest_of "$whole")"
    exit 1
  fi
  grep -q '"resumed_step":2' <<<"$resumed" || { echo "FAILED: no resumed_step 2"; exit 1; }
  echo "ok: saved on fsdp 2 / tp 2, resumed on 2x2 / 2x2: $(digest_of "$whole")"
  # Ordered mode with the generator on another tp degree: parity is reported, the run goes on.
  ordered=$("$bin" "${rl[@]}" --steps 3 --mode ordered --ranks 1 --generator-mesh 2 --generator-names tp)
  grep -q '"parity":{"identical":[0-9]*,"max_abs_diff":[-0-9.e]*,"tokens":216}' <<<"$ordered" ||
    { echo "FAILED: ordered parity: $ordered"; exit 1; }
  echo "ok: ordered mode, trainer tp 1 / generator tp 2, reports $(grep -o '"parity":{[^}]*}' <<<"$ordered")"
  # ... and with the generator on the trainer's tp degree, the bits are the trainer's.
  same=$("$bin" "${rl[@]}" --steps 3 --mode ordered --mesh 2 --names tp --generator-mesh 2 \
    --generator-names tp)
  check_parity "ordered, tp 2 / tp 2" "$same"
  echo "ok: ordered mode, tp 2 / tp 2: identical"
  ;;
errors)
  expect_error() {
    local pattern=$1
    shift
    local out status=0
    out=$("$bin" "$@" 2>&1) || status=$?
    if [ "$status" != 2 ] || ! grep -q -- "$pattern" <<<"$out"; then
      echo "FAILED: meshtensor $*: exit $status, expected 2 and '$pattern':"
      echo "$out"
      exit 1
    fi
    echo "ok: $pattern"
  }
  base=(rl --init "$dir/ckpt" --steps 1 --prompt-bytes 8)
  expect_error "at least 2 samples per prompt, got 1" "${base[@]}" --samples 1
  expect_error "KL coefficient must be within \[0, 1e6\], got -0.5" "${base[@]}" --kl -0.5
  expect_error "'0' is too small" "${base[@]}" --prompts 0
  expect_error "'-3' is not" "${base[@]}" --new-tokens -3
  expect_error "tensor-parallel degree 3 does not divide the model's 4 heads" "${base[@]}" \
    --ranks 3 --generator-mesh 3 --generator-names tp
  expect_error "do not share a world" "${base[@]}" --ranks 2 --generator-mesh 3 --generator-names dp
  expect_error "do not fit the model's context of 32" "${base[@]}" --new-tokens 30
  expect_error "--mode native" "${base[@]}" --mode native
  expect_error "task 'poetry' is not words or arithmetic" "${base[@]}" --task poetry
  expect_error "temperature must be within (0, 1000\], got 0" "${base[@]}" --temperature 0
  expect_error "clip ratio must be within (0, 1), got 1" "${base[@]}" --clip-ratio 1
  expect_error "brings its own model" "${base[@]}" --model gpt
  expect_error "cannot read the word list $dir/none" "${base[@]}" --dictionary "$dir/none"
  # Word lists that are no word list: named, never read past their size, a FIFO never opened.
  mkfifo "$dir/fifo"
  expect_error "$dir/fifo: not a regular file (it is a FIFO)" "${base[@]}" --dictionary "$dir/fifo"
  expect_error "/dev/zero: not a regular file (it is a character device)" "${base[@]}" \
    --dictionary /dev/zero
  : >"$dir/empty"
  expect_error "the word list $dir/empty holds no word" "${base[@]}" --dictionary "$dir/empty"
  truncate -s 100G "$dir/huge"
  expect_error "more than the 67108864 bytes of a word list" "${base[@]}" --dictionary "$dir/huge"
  expect_error "$dir: not a regular file (it is a directory)" "${base[@]}" --dictionary "$dir"
  expect_error "dp (replicas) then tp" "${base[@]}" --generator-mesh 2x1 --generator-names tp,dp
  expect_error "3 mini-batches is more than the 2 completions" "${base[@]}" --prompts 1 --samples 2 --minibatches 3
  # Not a checkpoint, and a checkpoint of another model (an MLP): named, nothing built.
  expect_error "$dir/none" rl --init "$dir/none" --steps 1
  "$bin" train --model mlp:8 --steps 1 --batch 16 --ranks 1 --save "$dir/mlp" >/dev/null
  expect_error "is not a decoder's" rl --init "$dir/mlp" --steps 1
  # An RL resume of a train checkpoint is refused by name; the checkpoint is untouched.
  before=$(find "$dir/ckpt" -type f -exec sha256sum {} + | sort)
  expect_error "was not saved by an RL run" "${base[@]}" --resume "$dir/ckpt"
  # train does not resume an RL checkpoint (it has no training position); generate reads it.
  "$bin" "${base[@]}" --save "$dir/rlsave" >/dev/null
  expect_error "was saved by meshtensor rl, not by train" train --model gpt:layers=2,heads=4,dim=32,context=32 \
    --steps 5 --resume "$dir/rlsave"
  "$bin" generate --checkpoint "$dir/rlsave" --prompt "The " --max-new-tokens 4 >/dev/null
  # --save into a directory that is not a checkpoint root loses nothing.
  mkdir -p "$dir/mine"
  echo "notes" >"$dir/mine/LATEST"
  expect_error "$dir/mine" "${base[@]}" --save "$dir/mine"
  [ "$(cat "$dir/mine/LATEST")" = notes ] || { echo "FAILED: LATEST was changed"; exit 1; }
  after=$(find "$dir/ckpt" -type f -exec sha256sum {} + | sort)
  [ "$before" = "$after" ] || { echo "FAILED: the init checkpoint changed"; exit 1; }
  echo "ok: nothing lost"
  ;;
*)
  echo "unknown case $case_name"
  exit 2
  ;;
esac
