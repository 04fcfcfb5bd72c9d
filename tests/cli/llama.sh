#!/usr/bin/env bash
# The Llama family from the command line. Usage: llama.sh <meshtensor> <case> [mpirun...]
#   exact_layouts  exact mode: one weights and one logits digest on 1 rank, fsdp 3, tp 2 (2
#                  key/value heads), pp 2 x tp 2 with sequence parallelism, hsdp 2x2 with 3
#                  micro-batches, dp x tp with selective checkpointing
#   qk_norm        the same with QK-norm and 4 query heads per key/value head, over 1 rank, tp 2
#                  with sequence parallelism and pp 2 x fsdp 2
#   published      the published architectures' features (heads of head_dim, q/k/v, output and
#                  MLP biases, llama3-rescaled RoPE, an MLP of gcd(ffn, heads) blocks) trained
#                  on windows shorter than the context (--seq-len): one digest on 1 rank, fsdp
#                  3, tp 2 with sequence parallelism, hsdp 2x2 with 3 micro-batches, cp 2;
#                  generate on tp 2 gives the 1-rank bits
#   tie            a head tied to the embedding: one digest on 1 rank, fsdp 3, tp 2 with sequence
#                  parallelism, hsdp 2x2 with 3 micro-batches, fsdp 2 with full checkpointing;
#                  generate on tp 2 gives the 1-rank bits; the checkpoint holds one table;
#                  ordered mode on fsdp x tp with QK-norm: replicas identical
#   resume         a tp 2 checkpoint resumed on fsdp 3 ends on the uninterrupted bits; a GPT run
#                  refuses it by family
#   generate       generate on tp 2 gives the 1-rank tokens and log-probabilities; the trainer
#                  scores the generator's tokens with difference 0 on tp layouts; rl runs
#   errors         bad shapes and layouts exit 2 naming the values
#   mpi            exact mode: 4 mpi processes on fsdp x tp end on the 1-rank digest
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

model=llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,context=24
run=(train --mode exact --model "$model" --batch 12 --steps 3 --seed 4)

# same_over_layouts REFERENCE LAYOUT...: each layout ("shape names extra...") gives REFERENCE.
same_over_layouts() {
  local reference=$1
  shift
  for layout in "$@"; do
    read -r shape names extra <<<"$layout"
    # shellcheck disable=SC2086
    same "$reference" "$(digests "$bin" "${run[@]}" --mesh "$shape" --names "$names" $extra)" \
      "$shape $names $extra vs 1 rank"
  done
}

case $case_name in
exact_layouts)
  same_over_layouts "$(digests "$bin" "${run[@]}" --ranks 1)" "3 fsdp" "2 tp" \
    "2x2 pp,tp --sequence-parallel" "2x2 dp,fsdp --micro-batches 3" \
    "2x2 dp,tp --activation-checkpointing selective"
  ;;
qk_norm)
  run=(train --mode exact --model llama:layers=2,heads=8,kv_heads=2,dim=32,ffn=64,context=24,qk_norm=1
       --batch 8 --steps 3 --seed 4)
  same_over_layouts "$(digests "$bin" "${run[@]}" --ranks 1)" "2 tp --sequence-parallel" "2x2 pp,fsdp"
  ;;
published)
  published=llama:layers=2,heads=4,kv_heads=2,dim=24,ffn=44,context=48,head_dim=10,qkv_bias=1
  published+=,out_bias=1,mlp_bias=1,rope_theta=500000,rope_scaling=llama3:8:1:4:32
  run=(train --mode exact --model "$published" --seq-len 16 --batch 12 --steps 3 --seed 4)
  same_over_layouts "$(digests "$bin" "${run[@]}" --ranks 1)" "3 fsdp" \
    "2 tp --sequence-parallel" "2x2 dp,fsdp --micro-batches 3" "2 cp"
  "$bin" "${run[@]}" --mesh 2 --names tp --save "$dir/ckpt" >/dev/null
  gen=(generate --checkpoint "$dir/ckpt" --prompt "Someone" --max-new-tokens 30 --json --mode exact)
  [ "$("$bin" "${gen[@]}" --ranks 1)" = "$("$bin" "${gen[@]}" --ranks 2)" ] ||
    fail "the published features generated other bits on tp 2"
  echo "ok: generate on tp 2 gives the 1-rank bits, past the training windows"
  expect 2 "a window of 64 tokens is longer than the model's context of 48" \
    "$bin" train --model "$published" --seq-len 64 --steps 1
  ;;
tie)
  run=(train --mode exact --model "$model,tie=1" --batch 12 --steps 3 --seed 4)
  same_over_layouts "$(digests "$bin" "${run[@]}" --ranks 1)" "3 fsdp" "2 tp --sequence-parallel" \
    "2x2 dp,fsdp --micro-batches 3" "2 fsdp --activation-checkpointing full"
  "$bin" "${run[@]}" --mesh 2 --names fsdp --save "$dir/ckpt" >/dev/null
  gen=(generate --checkpoint "$dir/ckpt" --prompt "Someone" --max-new-tokens 12 --json --mode exact)
  [ "$("$bin" "${gen[@]}" --ranks 1)" = "$("$bin" "${gen[@]}" --ranks 2)" ] ||
    fail "a tied model generated other bits on tp 2"
  echo "ok: a tied model generates the same bits on tp 2"
  inspected=$("$bin" checkpoint inspect "$dir/ckpt")
  grep -q "tie=1" <<<"$inspected" || fail "the architecture does not say tie=1"
  ! grep -q "model.head.output.weight" <<<"$inspected" || fail "a tied checkpoint holds a head weight"
  echo "ok: the checkpoint holds the table once"
  # Ordered mode: every replica holds the same bits.
  expect 0 "replicas identical on 4 ranks" "$bin" train --model "$model,tie=1,qk_norm=1" \
    --batch 12 --steps 3 --mesh 2x2 --names fsdp,tp --sequence-parallel
  ;;
resume)
  run=(train --mode exact --model "$model" --batch 12 --steps 4 --seed 4)
  whole=$(digests "$bin" "${run[@]}" --ranks 1)
  "$bin" "${run[@]}" --mesh 2 --names tp --save "$dir/ckpt" --save-every 2 --stop-after 2 >/dev/null
  same "$whole" "$(digests "$bin" "${run[@]}" --mesh 3 --names fsdp --resume "$dir/ckpt")" \
    "tp 2 resumed on fsdp 3 vs uninterrupted"
  expect 2 "holds the llama model .* this run trains the gpt model" \
    "$bin" train --model gpt:layers=2,heads=4,dim=32,context=24 --batch 12 --steps 4 \
    --resume "$dir/ckpt"
  expect 0 "architecture: llama layers=2 heads=4 kv_heads=2" "$bin" checkpoint inspect "$dir/ckpt"
  ;;
generate)
  "$bin" "${run[@]}" --ranks 1 --save "$dir/ckpt" >/dev/null
  gen=(generate --checkpoint "$dir/ckpt" --prompt "Someone" --max-new-tokens 12 --json --mode exact)
  one=$("$bin" "${gen[@]}" --ranks 1)
  two=$("$bin" "${gen[@]}" --ranks 2)
  [ -n "$one" ] && [ "$one" = "$two" ] || fail "tp 2 generated '$two', 1 rank '$one'"
  echo "ok: generate on tp 2 = 1 rank: $one"
  for layout in "2 tp --sequence-parallel" "2x2 pp,tp"; do
    read -r shape names extra <<<"$layout"
    # shellcheck disable=SC2086
    expect 0 "with the same log-probability bits, largest difference 0" \
      "$bin" "${run[@]}" --mesh "$shape" --names "$names" $extra --verify-generator
  done
  expect 0 "parity: .* with the trainer's log-probability bits (largest difference 0)" \
    "$bin" rl --model llama:layers=1,heads=2,kv_heads=1,dim=16,ffn=32,context=32 --steps 2 \
    --prompts 2 --samples 2 --new-tokens 4 --task arithmetic
  ;;
errors)
  expect 2 "3 kv_heads do not divide the 4 heads" "$bin" train --model llama:heads=4,kv_heads=3 --steps 1
  expect 2 "the head dim 9 is odd" "$bin" train --model llama:heads=4,kv_heads=2,dim=36 --steps 1
  expect 2 "tensor-parallel degree 4 does not divide the model's 2 key/value heads" \
    "$bin" train --model "$model" --mesh 4 --names tp --steps 1
  expect 2 "rope_theta" "$bin" train --model llama:rope_theta=0 --steps 1
  expect 2 "the tied head reads the token embedding's table, which a pp mesh dim of 2" \
    "$bin" train --model "$model,tie=1" --mesh 2 --names pp --steps 1
  expect 2 "tensor-parallel degree 4 does not divide the model's 2 MLP blocks (gcd of ffn 102" \
    "$bin" train --model llama:heads=4,kv_heads=4,ffn=102 --mesh 4 --names tp --steps 1
  "$bin" "${run[@]}" --ranks 1 --save "$dir/ckpt" >/dev/null
  expect 2 "tensor-parallel degree 4 does not divide the model's 2 key/value heads" \
    "$bin" generate --checkpoint "$dir/ckpt" --prompt a --ranks 4
  ;;
mpi)
  one=$(digests "$bin" "${run[@]}" --ranks 1)
  shift 2
  same "$one" "$(digests "$@" -np 4 "$bin" "${run[@]}" --backend mpi --mesh 2x2 --names fsdp,tp \
    --sequence-parallel)" "mpi fsdp x tp 2x2 vs 1 rank"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
