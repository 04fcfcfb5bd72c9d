#!/usr/bin/env bash
# Configures and builds one CMake preset (default: "default"), installing what is missing.
# Usage: scripts/build.sh [preset]
set -euo pipefail
cd "$(dirname "$0")/.."

preset=${1:-default}
extra=()
[ "$preset" = fuzz ] && extra=(clang libclang-rt-14-dev)
bash scripts/install-deps.sh "${extra[@]}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
