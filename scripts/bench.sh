#!/usr/bin/env bash
# The benchmark set behind the published figures (opt-in; a few minutes on 2 cores):
# - 16M-element f32 all_reduce on the threads backend (2 and 8 ranks) and on the mpi backend (2 and
#   8 processes) in ordered and exact mode, each against the native collective in the same run;
# - redistributes, merged plan against the unmerged one (one mesh dim per collective) in the same
#   run, on both backends;
# - planning time per call, uncached and cached, for meshes from 1-D to 4-D.
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
for mode in ordered exact; do
  "$bin" bench redistribute --mesh 4x2x1 --from P,P,R --to R,R,R --shape 2048x2048 --mode "$mode" \
    --iterations 7 --json
  mpirun "${mpirun_flags[@]}" -np 8 "$bin" bench redistribute --backend mpi --mesh 4x2x1 \
    --from P,P,R --to R,R,R --shape 2048x2048 --mode "$mode" --iterations 7 --json
done
"$bin" bench redistribute --mesh 2x2x2 --from P,S0,P --to R,R,R --shape 2048x2048 --iterations 7 --json
"$bin" bench redistribute --mesh 4x2 --from S0,S1 --to R,R --shape 2048x2048 --iterations 7 --json
"$bin" bench plan --json
