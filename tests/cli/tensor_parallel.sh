#!/usr/bin/env bash
# Tensor-parallel training from the command line. Usage: tensor_parallel.sh <meshtensor> <case>
#   exact_layouts  exact mode: one weights digest for fsdp 8, dp x fsdp x tp 2x2x2 with sequence
#                  parallelism, fsdp x tp 4x2 with micro-batches, tp 4 alone, dims named in
#                  another order; and for a 3-head model on 1 rank, fsdp x tp 2x3 and tp 3
#   logits         exact mode: one checkpoint's logits digest is the same under tp 1, 2 and 4
#   ordered        ordered mode: replicas identical on 2x2x2 with sequence parallelism
#   mpi            exact mode: 8 mpi processes on 2x2x2 end on the threads digest
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT


run=(train --mode exact --model gpt:layers=2,heads=4,dim=32,context=24 --batch 8 --steps 3 --seed 4)
case $case_name in
exact_layouts)
  whole=$("$bin" "${run[@]}" --mesh 8 --names fsdp | field "weights digest")
  for layout in "2x2x2 dp,fsdp,tp --sequence-parallel" "4x2 fsdp,tp --micro-batches 2" \
                "1x1x4 dp,fsdp,tp" "2x2x2 tp,dp,fsdp --sequence-parallel"; do
    read -r shape names extra <<<"$layout"
    # shellcheck disable=SC2086
    same "$whole" "$("$bin" "${run[@]}" --mesh "$shape" --names "$names" $extra | field "weights digest")" \
      "$shape $names $extra vs fsdp 8"
  done
  three=(train --mode exact --model gpt:layers=1,heads=3,dim=24,context=16 --batch 6 --steps 3)
  one=$("$bin" "${three[@]}" --ranks 1 | field "weights digest")
  same "$one" "$("$bin" "${three[@]}" --mesh 2x3 --names fsdp,tp --sequence-parallel | field "weights digest")" \
    "3 heads: fsdp x tp 2x3 vs 1 rank"
  same "$one" "$("$bin" "${three[@]}" --mesh 3 --names tp | field "weights digest")" "3 heads: tp 3 vs 1 rank"
  ;;
logits)
  "$bin" "${run[@]}" --mesh 2x2 --names fsdp,tp --save "$dir" >/dev/null
  reference=$("$bin" "${run[@]}" --ranks 1 --resume "$dir" | field "logits digest")
  for layout in "2 tp" "4 tp" "2x2 tp,fsdp"; do
    read -r shape names <<<"$layout"
    same "$reference" "$("$bin" "${run[@]}" --mesh "$shape" --names "$names" --resume "$dir" | field "logits digest")" \
      "logits after the checkpoint: tp $shape vs 1 rank"
  done
  ;;
ordered)
  out=$("$bin" train --model gpt:layers=2,heads=4,dim=32,context=24 --batch 8 --steps 3 \
    --mesh 2x2x2 --names dp,fsdp,tp --sequence-parallel --clip-grad-norm 0.5)
  grep -q "replicas identical on 8 ranks" <<<"$out" || { echo "FAILED: $out"; exit 1; }
  echo "ok: ordered replicas identical"
  ;;
mpi)
  threads=$("$bin" "${run[@]}" --mesh 2x2x2 --names dp,fsdp,tp --sequence-parallel | field "weights digest")
  shift 2
  processes=$("$@" -np 8 "$bin" "${run[@]}" --backend mpi --mesh 2x2x2 --names dp,fsdp,tp \
    --sequence-parallel | field "weights digest")
  same "$threads" "$processes" "mpi 8 processes vs threads"
  ;;
esac
