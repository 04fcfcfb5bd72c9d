#!/usr/bin/env bash
# The benchmark set behind the published figures (opt-in; about ten minutes on 2 cores). Every
# figure is a ratio to a baseline timed in the same run.
# 1. The collective sweep (mpi backend, 2 and 8 processes, f32): all_reduce, reduce_scatter and
#    all_gather at 1 and 1024 elements (latency) and 64K to 16M elements, ordered and exact mode
#    against the native MPI collective, as one table.
# 2. The 16M-element all_reduce on the threads backend (2 and 8 ranks) against native and the
#    memory-bandwidth bound.
# 3. Redistributes, merged plan against the unmerged one (one mesh dim per collective), on both
#    backends; planning time per call, uncached and cached, for meshes from 1-D to 4-D.
# 4. Python: DTensor.redistribute of small tensors against the same C++ call (threads backend,
#    2 and 4 ranks, and the mpi backend with 4 processes).
# Usage: bash scripts/bench.sh [sweep|threads|redistribute|python|all]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default >/dev/null
bin=build/src/meshtensor
mpirun_flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root)
what=${1:-all}
counts=1,1024,65536,262144,1048576,4194304,16777216

if [ "$what" = all ] || [ "$what" = sweep ]; then
  echo "== collective sweep: mpi backend, f32, time per call (median) and ratio to native"
  header=1
  for ranks in 2 8; do
    mpirun "${mpirun_flags[@]}" -np "$ranks" "$bin" bench collective --backend mpi \
      --op all_reduce,reduce_scatter,all_gather --count "$counts" --mode ordered,exact |
      if [ $header = 1 ]; then cat; else tail -n +2; fi
    header=0
  done
fi

if [ "$what" = all ] || [ "$what" = threads ]; then
  echo "== threads backend: 16M-element all_reduce"
  for ranks in 2 8; do
    for mode in ordered exact; do
      "$bin" bench collective --backend threads --ranks "$ranks" --count 16777216 --mode "$mode" --json
    done
  done
fi

if [ "$what" = all ] || [ "$what" = redistribute ]; then
  echo "== redistribute: merged against unmerged, and planning time"
  for mode in ordered exact; do
    "$bin" bench redistribute --mesh 4x2x1 --from P,P,R --to R,R,R --shape 2048x2048 --mode "$mode" \
      --iterations 7 --json
    mpirun "${mpirun_flags[@]}" -np 8 "$bin" bench redistribute --backend mpi --mesh 4x2x1 \
      --from P,P,R --to R,R,R --shape 2048x2048 --mode "$mode" --iterations 7 --json
  done
  "$bin" bench redistribute --mesh 2x2x2 --from P,S0,P --to R,R,R --shape 2048x2048 --iterations 7 --json
  "$bin" bench redistribute --mesh 4x2 --from S0,S1 --to R,R --shape 2048x2048 --iterations 7 --json
  "$bin" bench plan --json
fi

if [ "$what" = all ] || [ "$what" = python ]; then
  echo "== Python overhead: DTensor.redistribute against the C++ call"
  python=$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' build/CMakeCache.txt)
  export PYTHONPATH=$PWD/build/python
  for ranks in 2 4; do
    "$python" bench/python_overhead.py --ranks "$ranks"
  done
  mpirun "${mpirun_flags[@]}" -np 4 "$python" bench/python_overhead.py
fi
