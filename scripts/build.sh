#!/usr/bin/env bash
# Configures and builds one CMake preset (default: "default"), installing what is missing; the
# default preset also installs the Python package (scripts/install-python.sh).
# Usage: scripts/build.sh [preset]
set -euo pipefail
cd "$(dirname "$0")/.."

preset=${1:-default}
extra=()
[ "$preset" = fuzz ] && extra=(clang libclang-rt-14-dev)
bash scripts/install-deps.sh "${extra[@]}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
# The default build also installs the Python package, so that `import meshtensor` works.
if [ "$preset" = default ] && [ -f build/python/meshtensor/__init__.py ]; then
  bash scripts/install-python.sh build
fi
