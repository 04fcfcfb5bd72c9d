#!/usr/bin/env bash
# Resume through `meshtensor train --save/--resume`: each case compares the weights digest of a
# stopped-and-resumed run with the run that was never stopped.
# Usage: checkpoint_resume.sh <meshtensor binary> <case> [mpirun command...]
#   exact_layouts  exact mode: FSDP 8 ranks for 2 of 4 epochs, resumed on HSDP 2x2 (4 ranks),
#                  equals 4 uninterrupted epochs on DDP 3 ranks
#   gpt_layouts    exact mode, a GPT on fortunes: FSDP 4 for 3 of 6 steps, resumed on HSDP 2x2,
#                  equals 6 uninterrupted steps on 1 rank; a resume with another model is refused
#   exact_chain    exact mode, 40 steps in four legs, each resumed on another layout and saved:
#                  FSDP 8 -> HSDP 2x2 -> DDP 3 (uneven shards) -> 1 rank, against HSDP 4x2 in one go
#   ordered_same   ordered mode, HSDP 2x2, saved every 7 steps mid-epoch: resuming any of the
#                  kept checkpoints on the same layout equals the uninterrupted run
#   mpi            exact mode: saved by 4 mpi processes (FSDP), resumed on 2 thread ranks (DDP)
#   errors         bad checkpoints and mismatched runs: clear errors, exit 2 (verify: 1)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT


case $case_name in
exact_layouts)
  run=(train --mode exact --model mlp:32 --batch 1000 --epochs 4 --seed 3)
  "$bin" "${run[@]}" --strategy fsdp --ranks 8 --stop-after 2 --save "$dir" >"$dir/first.txt"
  grep -q "saved 1 checkpoint(s), the last $dir/step-00000120" "$dir/first.txt"
  "$bin" checkpoint verify "$dir"
  resumed=$("$bin" "${run[@]}" --strategy hsdp --mesh 2x2 --resume "$dir" | tee "$dir/second.txt" | field "weights digest")
  grep -q "resumed from $dir at step 120" "$dir/second.txt"
  whole=$("$bin" "${run[@]}" --strategy ddp --ranks 3 | field "weights digest")
  same "$whole" "$resumed" "fsdp 8 (2 epochs) -> hsdp 2x2 (2 epochs) vs ddp 3 (4 epochs)"
  ;;
gpt_layouts)
  run=(train --mode exact --model gpt:layers=1,heads=2,dim=32,context=32 --batch 6 --steps 6
       --seed 5)
  "$bin" "${run[@]}" --strategy fsdp --ranks 4 --stop-after 3 --save "$dir" >"$dir/first.txt"
  grep -q "saved 1 checkpoint(s), the last $dir/step-00000003" "$dir/first.txt"
  resumed=$("$bin" "${run[@]}" --strategy hsdp --mesh 2x2 --resume "$dir" | tee "$dir/second.txt" | field "weights digest")
  grep -q "resumed from $dir at step 3" "$dir/second.txt"
  whole=$("$bin" "${run[@]}" --ranks 1 | field "weights digest")
  same "$whole" "$resumed" "gpt: fsdp 4 (3 steps) -> hsdp 2x2 (3 steps) vs 1 rank (6 steps)"
  set +e
  other=$("$bin" train --mode exact --model gpt:layers=1,heads=4,dim=32,context=32 --batch 6 \
    --steps 6 --seed 5 --resume "$dir" 2>&1)
  status=$?
  set -e
  [ "$status" = 2 ] && grep -q "holds the gpt model 'gpt layers=1 heads=2" <<<"$other" ||
    { echo "FAILED: a resume with other heads: exit $status: $other"; exit 1; }
  ;;
exact_chain)
  run=(train --mode exact --model mlp:30,20 --batch 600 --steps 40 --seed 7 --optimizer adamw)
  "$bin" "${run[@]}" --strategy fsdp --ranks 8 --stop-after 10 --save "$dir/a" >/dev/null
  "$bin" "${run[@]}" --strategy hsdp --mesh 2x2 --resume "$dir/a" --stop-after 20 --save "$dir/b" >/dev/null
  "$bin" "${run[@]}" --strategy ddp --ranks 3 --resume "$dir/b" --stop-after 30 --save "$dir/c" >/dev/null
  resumed=$("$bin" "${run[@]}" --ranks 1 --resume "$dir/c" | field "weights digest")
  whole=$("$bin" "${run[@]}" --mesh 4x2 | field "weights digest")
  same "$whole" "$resumed" "fsdp 8 -> hsdp 2x2 -> ddp 3 -> 1 rank vs hsdp 4x2"
  ;;
ordered_same)
  run=(train --model mlp:24,16 --batch 700 --steps 40 --seed 9 --mesh 2x2 --optimizer adamw)
  "$bin" "${run[@]}" --stop-after 30 --save "$dir" --save-every 7 --keep-checkpoints 3 >/dev/null
  ls "$dir"
  [ "$(ls -d "$dir"/step-* | wc -l)" = 3 ] || { echo "FAILED: --keep-checkpoints 3"; exit 1; }
  [ "$(cat "$dir/LATEST")" = step-00000030 ] || { echo "FAILED: LATEST"; exit 1; }
  whole=$("$bin" "${run[@]}" | field "weights digest")
  for checkpoint in "$dir"/step-*; do
    resumed=$("$bin" "${run[@]}" --resume "$checkpoint" | field "weights digest")
    same "$whole" "$resumed" "ordered resume from $(basename "$checkpoint")"
  done
  ;;
mpi)
  run=(train --mode exact --model mlp:16 --batch 500 --steps 30 --seed 2)
  "$@" -np 4 "$bin" "${run[@]}" --backend mpi --strategy fsdp --stop-after 11 --save "$dir" >/dev/null
  resumed=$("$bin" "${run[@]}" --ranks 2 --resume "$dir" | field "weights digest")
  whole=$("$bin" "${run[@]}" --ranks 1 | field "weights digest")
  same "$whole" "$resumed" "mpi fsdp 4 -> threads ddp 2 vs 1 rank"
  ;;
errors)
  run=(train --model mlp:16 --batch 500 --steps 6 --seed 2 --strategy fsdp --ranks 2)
  "$bin" "${run[@]}" --save "$dir" >/dev/null
  expect 0 '"step": 6' "$bin" checkpoint inspect "$dir" --json
  expect 0 "model.0.weight  *F32  *\[784, 16\]  *2" "$bin" checkpoint inspect "$dir"
  expect 2 "batch 500 over 60000 samples; this run has batch 400" \
    "$bin" train --model mlp:16 --batch 400 --steps 6 --resume "$dir"
  expect 2 "holds the mlp model 'mlp hidden=16 .*', but this run trains the mlp model 'mlp hidden=17" \
    "$bin" train --model mlp:17 --batch 500 --steps 6 --resume "$dir"
  expect 2 "has no tensor 'optimizer.0.weight.momentum_buffer'" \
    "$bin" train --model mlp:16 --batch 500 --steps 6 --optimizer sgd --resume "$dir"
  expect 0 "warning: the checkpoint's run had the learning-rate schedule 'cosine base=0.001 warmup=0 total_steps=6', this run has 'cosine base=0.001 warmup=0 total_steps=9'" \
    "$bin" train --model mlp:16 --batch 500 --steps 9 --seed 2 --strategy fsdp --ranks 2 --resume "$dir"
  expect 2 "no checkpoint at $dir/nothing" "$bin" "${run[@]}" --resume "$dir/nothing"
  expect 2 "holds the mlp model 'mlp hidden=16 activation=relu layernorm=no', but this run trains the mlp model 'mlp hidden=16 activation=gelu layernorm=no'" \
    "$bin" "${run[@]}" --activation gelu --resume "$dir"
  file=$(ls "$dir"/step-*/rank-00001.safetensors)
  cp "$file" "$dir/saved"
  size=$(stat -c %s "$file")
  printf '\x7f' | dd of="$file" bs=1 seek=$((size - 3)) conv=notrunc status=none
  expect 1 "FAILED: checksum mismatch in .*rank-00001.safetensors: tensor '" "$bin" checkpoint verify "$dir"
  expect 2 "checksum mismatch in .*rank-00001.safetensors: tensor '" "$bin" train --model mlp:16 --batch 500 --steps 6 --ranks 3 --resume "$dir"
  truncate -s $((size - 100)) "$file"
  expect 2 "rank-00001.safetensors.*truncated" "$bin" "${run[@]}" --resume "$dir"
  expect 1 "rank-00001.safetensors.*truncated" "$bin" checkpoint verify "$dir"
  cp "$dir/saved" "$file"
  expect 0 "OK: 2 file(s)" "$bin" checkpoint verify "$dir"
  ;;
*)
  echo "unknown case $case_name"
  exit 2
  ;;
esac
