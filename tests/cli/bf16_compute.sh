#!/usr/bin/env bash
# bf16 compute (--param-dtype bf16): exact runs give one digest on every layout and at every
# SIMD level (the bf16 dot-product instruction and its emulations), other than f32's; ordered
# runs give one digest at every SIMD level; mpi processes end on the threads' exact digest.
# Usage: bf16_compute.sh <meshtensor> <gpt|llama|mpi> [mpirun...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case $2 in
  gpt) model=gpt:layers=2,heads=2,dim=32,context=16 ;;
  llama | mpi) model=llama:layers=2,heads=4,kv_heads=2,dim=32,context=16 ;;
  *) fail "unknown case $2" ;;
esac
run=(train --model "$model" --steps 3 --batch 4 --no-sample --param-dtype bf16)
want=$(digests "$bin" "${run[@]}" --mode exact --ranks 1)
if [ "$2" = mpi ]; then
  shift 2
  same "$want" "$(digests "$@" -np 4 "$bin" "${run[@]}" --mode exact --backend mpi --mesh 2x2 \
    --names fsdp,tp)" "exact bf16 on 4 mpi processes"
  echo "passed"
  exit 0
fi
f32=$(digests "$bin" train --model "$model" --steps 3 --batch 4 --no-sample --mode exact --ranks 1)
[ "$want" != "$f32" ] || fail "bf16 compute gave f32's digests $f32"
for layout in "--ranks 4 --strategy fsdp" "--mesh 2x2 --names dp,fsdp --micro-batches 2" \
              "--mesh 2x2 --names fsdp,tp" "--mesh 2x2 --names cp,tp" "--mesh 2 --names pp"; do
  # shellcheck disable=SC2086
  same "$want" "$(digests "$bin" "${run[@]}" --mode exact $layout)" "exact bf16 on $layout"
  echo "ok: exact on $layout: $want"
done
# The generator computes as the trainer does: its tokens score to the trainer's bits.
out=$("$bin" "${run[@]}" --mode exact --mesh 2x2 --names fsdp,tp --verify-generator)
grep -q "with the same log-probability bits, largest difference 0$" <<<"$out" ||
  fail "generator check: $(grep 'generator check' <<<"$out")"
if [ "$2" = gpt ]; then
  # GRPO: trainer and generator on different layouts, every token's log-probability the same.
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  "$bin" train --mode exact --model "$model" --batch 4 --steps 2 --eval-every 0 --ranks 1 \
    --save "$dir/ckpt" >/dev/null
  rl=(rl --init "$dir/ckpt" --prompts 2 --samples 2 --new-tokens 6 --prompt-bytes 8 --steps 2
      --mode exact --param-dtype bf16 --json)
  one=$("$bin" "${rl[@]}" --ranks 1)
  grep -q '"parity":{"identical":48,"max_abs_diff":0.0,"tokens":48}' <<<"$one" ||
    fail "rl parity on 1 rank: $(grep -o '"parity":{[^}]*}' <<<"$one")"
  other=$("$bin" "${rl[@]}" --ranks 4 --strategy fsdp --generator-mesh 2 --generator-names tp)
  grep -q '"parity":{"identical":48,"max_abs_diff":0.0,"tokens":48}' <<<"$other" ||
    fail "rl parity on fsdp 4, generator tp 2: $(grep -o '"parity":{[^}]*}' <<<"$other")"
  same "$(grep -o '"weights_digest":"[0-9a-f]*"' <<<"$one")" \
    "$(grep -o '"weights_digest":"[0-9a-f]*"' <<<"$other")" "rl bf16 digest on two layouts"
  echo "ok: rl"
fi
best=$(MESHTENSOR_SIMD= "$bin" bench peak --seconds 0.02 --triad-mib 12 | sed -n 's/.*, kernels \([a-z0-9]*\),.*/\1/p')
ordered=$(digests "$bin" "${run[@]}" --mode ordered --ranks 1)
for level in baseline avx2 avx512; do
  [ "$level" = avx512 ] && [ "$best" != avx512 ] && continue
  [ "$level" = avx2 ] && [ "$best" = baseline ] && continue
  same "$want" "$(MESHTENSOR_SIMD=$level digests "$bin" "${run[@]}" --mode exact --mesh 2x2 --names fsdp,tp)" \
    "exact bf16 at $level"
  same "$ordered" "$(MESHTENSOR_SIMD=$level digests "$bin" "${run[@]}" --mode ordered --ranks 1)" \
    "ordered bf16 at $level"
  if [ "$level" != avx512 ]; then
    said=$(MESHTENSOR_SIMD=$level "$bin" "${run[@]}" --mode ordered --ranks 1 2>&1)
    grep -q "bf16 compute: the kernels (.*kernels $level) have no bf16 dot-product instruction" \
      <<<"$said" || fail "no warning that bf16 products are emulated at $level"
  fi
  echo "ok: $level"
done
echo "passed"
