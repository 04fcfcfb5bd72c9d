#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a project outside the tree
# against it: once through find_package(meshtensor), once through pkg-config.
# Usage: install_test.sh <build dir> <consumer source dir>
set -euo pipefail
build=$1
source=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$source" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
g++ -O1 "$source/main.cpp" -o "$tmp/consumer-pkg-config" $(pkg-config --cflags --libs meshtensor)
"$tmp/consumer-pkg-config" | sed 's/^/pkg-config: /'
