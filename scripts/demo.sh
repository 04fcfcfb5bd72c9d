#!/usr/bin/env bash
# The main job: installs what is missing, builds meshtensor and trains on Fashion-MNIST across
# 4 thread ranks with FSDP, then shows two different layouts ending on the same weights in exact mode.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default
meshtensor=build/src/meshtensor

run() { echo; echo "\$ $*"; "$@"; }
# FSDP training of the default MLP (784-1024-1024-10, AdamW, cosine schedule) on 4 ranks.
run $meshtensor train --strategy fsdp --ranks 4 --epochs 3 --log build/demo-train.csv --plot build/demo-train.png
echo "(per-epoch figures in build/demo-train.csv, the curve in build/demo-train.png)"

# Exact mode: the same global batches on 4 ranks and on 3 ranks with 2 micro-batches each end on
# the same bits, which a fixed reduction order alone cannot give.
exact=(train --mode exact --model mlp:256 --steps 60 --seed 7)
run $meshtensor "${exact[@]}" --strategy fsdp --ranks 4 | tee build/demo-exact-a.txt
run $meshtensor "${exact[@]}" --mesh 3x1 --micro-batches 2 | tee build/demo-exact-b.txt
digest_a=$(grep -o 'weights digest [0-9a-f]*' build/demo-exact-a.txt)
digest_b=$(grep -o 'weights digest [0-9a-f]*' build/demo-exact-b.txt)
echo
if [ "$digest_a" = "$digest_b" ]; then
  echo "exact mode: FSDP on 4 ranks and HSDP 3x1 with 2 micro-batches end on the same $digest_a"
else
  echo "exact mode: the layouts differ: $digest_a vs $digest_b" >&2
  exit 1
fi
