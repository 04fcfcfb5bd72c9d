#!/usr/bin/env bash
# Installs the Python package of a build into a temporary prefix and imports it from there, away
# from the build and source trees.
# Usage: install_check.sh <build dir> <python> <site directory under the prefix>
set -euo pipefail
build=$1
python=$2
site=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --component python --prefix "$tmp/prefix" >/dev/null
cd "$tmp"
PYTHONPATH="$tmp/prefix/$site" "$python" - <<'PY'
import meshtensor, os, sys
assert meshtensor.__file__.startswith(os.environ["PYTHONPATH"]), meshtensor.__file__
plan = meshtensor.plan((2, 2), "S0,S0", "R,R", (8, 8))
assert plan.collectives == 1
print("installed package OK:", meshtensor.__file__)
PY
