#!/usr/bin/env bash
# The benchmark set behind the comm figures (opt-in; a few minutes on 2 cores): 16M-element f32
# all_reduce on the threads backend (2 and 8 ranks) and on the mpi backend (2 and 8 processes)
# in ordered and exact mode, each against the native collective timed in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default >/dev/null
bin=build/src/meshtensor
mpirun_flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root)
count=${MESHTENSOR_BENCH_COUNT:-16777216}
for ranks in 2 8; do
  for mode in ordered exact; do
    "$bin" bench collective --backend threads --ranks "$ranks" --count "$count" --mode "$mode" --json
  done
done
for ranks in 2 8; do
  for mode in ordered exact; do
    mpirun "${mpirun_flags[@]}" -np "$ranks" "$bin" bench collective --backend mpi --count "$count" \
      --mode "$mode" --json
  done
done
