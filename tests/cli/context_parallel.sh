#!/usr/bin/env bash
# Context-parallel training from the command line. Usage: context_parallel.sh <meshtensor> <case> [mpirun...]
#   exact_layouts  exact mode: one weights and logits digest for 1 rank and cp 2, 3 (an uneven
#                  context: 30 positions in 6 chunks of 5) and 4, cp x tp with sequence
#                  parallelism, cp x pp with micro-batches, cp x fsdp, cp x dp, activation
#                  checkpointing and gradient clipping, in any order of the names
#   llama          the same for the Llama family (GQA, RoPE at global positions, QK-norm)
#   checkpoint     a checkpoint saved on cp 2 resumes on tp 2 (and one saved on 1 rank on cp 3)
#                  with the uninterrupted run's bits
#   ordered        ordered mode: replicas identical on cp x fsdp x tp
#   errors         a context too short for the cp degree, cp on an MLP, generate/serve/rl with
#                  cp: clear errors naming the values
#   reduce_scatter exact mode, --micro-batch-mode reduce-scatter with micro-batches in which a
#                  rank owns a sequence and then none (batch 3 in 2 micro-batches): every dim
#                  that can leave a rank without a sequence (cp, fsdp, dp; with tp beside),
#                  the GPT and the Llama, end on the 1-rank digests
#   mpi            exact mode: 4 mpi processes on cp 2 x fsdp 2 end on the 1-rank digests (also
#                  in reduce-scatter micro-batches that leave a rank without a sequence)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

run=(train --mode exact --model gpt:layers=2,heads=2,dim=32,context=30 --batch 6 --seed 3)
check_layouts() {  # check_layouts <reference digests> <layout>...
  local want=$1
  shift
  for layout in "$@"; do
    read -r shape names extra <<<"$layout"
    # shellcheck disable=SC2086
    same "$want" "$(digests "$bin" "${run[@]}" --steps 3 --mesh "$shape" --names "$names" $extra)" \
      "$shape $names $extra vs 1 rank"
  done
}
case $case_name in
exact_layouts)
  one=$(digests "$bin" "${run[@]}" --steps 3 --ranks 1)
  check_layouts "$one" "2 cp" "3 cp" "4 cp" "2x2 cp,tp --sequence-parallel" "2x2 tp,cp" \
    "2x2 pp,cp --micro-batches 2" "2x2 cp,fsdp --micro-batches 3" "3x2 dp,cp" \
    "2x2x2 fsdp,cp,tp --sequence-parallel" "2 cp --activation-checkpointing full" \
    "3 cp --micro-batches 2 --no-reshard-after-forward"
  clipped=$(digests "$bin" "${run[@]}" --steps 3 --ranks 1 --clip-grad-norm 0.3 \
    --activation-checkpointing selective)
  check_layouts "$clipped" "2x2 cp,tp --sequence-parallel --clip-grad-norm 0.3 --activation-checkpointing selective"
  ;;
llama)
  run=(train --mode exact --model llama:layers=2,heads=4,kv_heads=2,dim=32,context=24,qk_norm=1
       --batch 4 --seed 5)
  one=$(digests "$bin" "${run[@]}" --steps 3 --ranks 1)
  check_layouts "$one" "3 cp" "2x2 cp,tp --sequence-parallel" "2x2 cp,pp --micro-batches 2"
  ;;
checkpoint)
  whole=$(digests "$bin" "${run[@]}" --steps 4 --ranks 1)
  "$bin" "${run[@]}" --steps 4 --stop-after 2 --mesh 2 --names cp --save "$dir/cp2" >/dev/null
  same "$whole" "$(digests "$bin" "${run[@]}" --steps 4 --mesh 2 --names tp --resume "$dir/cp2")" \
    "saved on cp 2 at step 2, resumed on tp 2"
  "$bin" "${run[@]}" --steps 4 --stop-after 2 --ranks 1 --save "$dir/one" >/dev/null
  same "$whole" "$(digests "$bin" "${run[@]}" --steps 4 --mesh 3 --names cp --resume "$dir/one")" \
    "saved on 1 rank at step 2, resumed on cp 3"
  ;;
ordered)
  out=$("$bin" train --model gpt:layers=2,heads=2,dim=32,context=30 --batch 6 --steps 3 \
    --mesh 2x2x2 --names cp,fsdp,tp --sequence-parallel --clip-grad-norm 0.5)
  grep -q "replicas identical on 8 ranks" <<<"$out" || fail "$out"
  echo "ok: ordered replicas identical"
  ;;
errors)
  expect 2 "the context of 30 positions does not split over cp 16 (2·cp = 32 chunks of 1 positions leave the last empty); cp degrees that split it: 2, 3, 4, 5, 15" \
    "$bin" "${run[@]}" --steps 1 --mesh 16 --names cp
  expect 2 "does not split over cp 7 (2·cp = 14 chunks of 3 positions leave the last empty)" \
    "$bin" "${run[@]}" --steps 1 --mesh 7 --names cp
  expect 2 "cp 2 needs a language model, not 'mlp" "$bin" train --steps 1 --mesh 2 --names cp
  "$bin" "${run[@]}" --steps 1 --ranks 1 --save "$dir/c" >/dev/null
  expect 2 "generate decodes a token at a time .* (cp in --names 'cp,tp')" \
    "$bin" generate --checkpoint "$dir/c" --mesh 2x2 --names cp,tp --prompt x
  expect 2 "serve decodes a token at a time" "$bin" serve --checkpoint "$dir/c" --mesh 2 --names cp
  expect 2 "rl's trainer scores whole rollouts on every rank; it takes dp, fsdp and tp dims, not cp" \
    "$bin" rl --init "$dir/c" --mesh 2 --names cp
  expect 2 "unknown mesh dim name 'sp' (expected pp, dp, fsdp, cp and tp" \
    "$bin" "${run[@]}" --steps 1 --mesh 2 --names sp
  ;;
reduce_scatter)
  split=(--micro-batches 2 --micro-batch-mode reduce-scatter)
  for model in gpt:layers=2,heads=2,dim=32,context=30 \
    llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=96,context=30; do
    run=(train --mode exact --model "$model" --batch 3 --seed 32 --eval-every 0)
    one=$(digests "$bin" "${run[@]}" --steps 3 --ranks 1)
    check_layouts "$one" "2 cp ${split[*]}" "3 cp ${split[*]}" "2x2 cp,fsdp ${split[*]}" \
      "2x2 dp,cp ${split[*]}" "2x2 cp,tp --sequence-parallel ${split[*]}" \
      "2x2 fsdp,tp ${split[*]}" "2x2x2 dp,fsdp,cp ${split[*]}"
  done
  ;;
mpi)
  one=$(digests "$bin" "${run[@]}" --steps 3 --ranks 1)
  shift 2
  same "$one" "$(digests "$@" -np 4 "$bin" "${run[@]}" --steps 3 --backend mpi --mesh 2x2 \
    --names cp,fsdp)" "4 mpi processes on cp 2 x fsdp 2 vs 1 rank"
  run=(train --mode exact --model gpt:layers=2,heads=2,dim=32,context=30 --batch 3 --seed 32)
  same "$(digests "$bin" "${run[@]}" --steps 3 --ranks 1)" \
    "$(digests "$@" -np 4 "$bin" "${run[@]}" --steps 3 --backend mpi --mesh 2x2 --names cp,fsdp \
      --micro-batches 2 --micro-batch-mode reduce-scatter)" \
    "4 mpi processes on cp 2 x fsdp 2, reduce-scatter micro-batches, vs 1 rank"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
