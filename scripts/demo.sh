#!/usr/bin/env bash
# The main job: builds meshtensor and shows what it is for.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default

run() { echo; echo "\$ $*"; "$@"; }
run build/src/meshtensor plan --mesh 2x2 --names dp,tp --from S0,S1 --to R,S0 --shape 5x3
run build/src/meshtensor plan --mesh 2x2x2 --names dp,fsdp,tp --from 'P,R,P' --to R,R,R --shape 16x16x16 --dtype bf16
run build/src/meshtensor plan --mesh 8x5x1 --names ddp,fsdp,tp --from P,P,R --to R,R,R --shape 1024x1024
run build/src/meshtensor check --mesh 8x5x1 --names ddp,fsdp,tp --from P,P,R --to R,R,R --shape 64x64 --mode exact
run build/src/meshtensor check --mesh 4x2 --from P,P --to S0,S1 --shape 13x7 --mode exact --no-merge
run build/examples/layout_tour
