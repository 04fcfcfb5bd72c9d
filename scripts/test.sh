#!/usr/bin/env bash
# Builds and runs the whole test suite for each preset named (default: "default").
# Presets: default, asan (ASan+UBSan), tsan, fuzz (clang + libFuzzer), stress.
set -euo pipefail
cd "$(dirname "$0")/.."

presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(default)
for preset in "${presets[@]}"; do
  echo "== preset: $preset"
  bash scripts/build.sh "$preset"
  ctest --preset "$preset" -j"$(nproc)"
done
