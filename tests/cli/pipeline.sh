#!/usr/bin/env bash
# Pipeline-parallel training from the command line. Usage: pipeline.sh <meshtensor> <case> [mpirun...]
#   exact_layouts  exact mode: one weights and logits digest for 1 rank and every pp degree,
#                  schedule, micro-batch count, activation checkpointing, and pp x fsdp x tp with
#                  sequence parallelism
#   checkpoint     a checkpoint saved on pp 2 resumes on 1 rank (and one saved on 1 rank on pp 4)
#                  with the uninterrupted run's bits; generation reads a pp checkpoint
#   ordered        ordered mode: replicas identical on pp x dp x tp
#   mpi            exact mode: 4 mpi processes on pp 2 x tp 2 end on the 1-rank digest
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT


run=(train --mode exact --model gpt:layers=4,heads=2,dim=32,context=16 --batch 8 --seed 4)
case $case_name in
exact_layouts)
  out=$("$bin" "${run[@]}" --steps 3 --ranks 1)
  weights=$(field "weights digest" <<<"$out")
  logits=$(field "logits digest" <<<"$out")
  for layout in "2 pp" "4 pp" "2 pp --pipeline-schedule gpipe --micro-batches 3" \
                "4 pp --micro-batches 8 --activation-checkpointing full" \
                "2 pp --pipeline-schedule interleaved-1f1b --micro-batches 6" \
                "2 pp --pipeline-schedule interleaved-1f1b --virtual-stages 2 --micro-batches 2 --activation-checkpointing selective" \
                "2x2x2 pp,fsdp,tp --sequence-parallel" \
                "2x2x2 fsdp,tp,pp --pipeline-schedule gpipe --clip-grad-norm 1e6" \
                "2x2 dp,pp --pipeline-schedule interleaved-1f1b --no-reshard-after-forward"; do
    read -r shape names extra <<<"$layout"
    # shellcheck disable=SC2086
    out=$("$bin" "${run[@]}" --steps 3 --mesh "$shape" --names "$names" $extra)
    same "$weights" "$(field "weights digest" <<<"$out")" "weights: $shape $names $extra vs 1 rank"
    same "$logits" "$(field "logits digest" <<<"$out")" "logits: $shape $names $extra vs 1 rank"
  done
  ;;
checkpoint)
  whole=$("$bin" "${run[@]}" --steps 4 --ranks 1 | field "weights digest")
  "$bin" "${run[@]}" --steps 4 --stop-after 2 --mesh 2 --names pp --save "$dir/pp2" >/dev/null
  same "$whole" "$("$bin" "${run[@]}" --steps 4 --ranks 1 --resume "$dir/pp2" | field "weights digest")" \
    "saved on pp 2 at step 2, resumed on 1 rank"
  "$bin" "${run[@]}" --steps 4 --stop-after 2 --ranks 1 --save "$dir/one" >/dev/null
  same "$whole" "$("$bin" "${run[@]}" --steps 4 --mesh 4 --names pp --resume "$dir/one" | field "weights digest")" \
    "saved on 1 rank at step 2, resumed on pp 4"
  "$bin" "${run[@]}" --steps 4 --mesh 2x2 --names pp,tp --save "$dir/pptp" >/dev/null
  text=$("$bin" generate --checkpoint "$dir/pptp" --prompt "A fool" --max-new-tokens 8 --mode exact)
  [ -n "$text" ] || { echo "FAILED: no text generated from the pp checkpoint"; exit 1; }
  echo "ok: generated from a pp x tp checkpoint: $text"
  ;;
ordered)
  out=$("$bin" train --model gpt:layers=4,heads=2,dim=32,context=16 --batch 8 --steps 3 \
    --mesh 2x2x2 --names pp,dp,tp --sequence-parallel --clip-grad-norm 0.5)
  grep -q "replicas identical on 8 ranks" <<<"$out" || { echo "FAILED: $out"; exit 1; }
  echo "ok: ordered replicas identical"
  ;;
mpi)
  one=$("$bin" "${run[@]}" --steps 3 --ranks 1 | field "weights digest")
  shift 2
  processes=$("$@" -np 4 "$bin" "${run[@]}" --steps 3 --backend mpi --mesh 2x2 --names pp,tp \
    --pipeline-schedule interleaved-1f1b | field "weights digest")
  same "$one" "$processes" "mpi 4 processes on pp 2 x tp 2 vs 1 rank"
  ;;
esac
