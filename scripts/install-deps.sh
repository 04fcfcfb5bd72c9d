#!/usr/bin/env bash
# Installs the Debian packages meshtensor builds with, if any is missing.
# Usage: scripts/install-deps.sh [extra package ...]
set -euo pipefail

packages=(cmake ninja-build g++ libgtest-dev libgmock-dev libcli11-dev libfmt-dev nlohmann-json3-dev
          libopenmpi-dev openmpi-bin clang-format time zlib1g-dev dataset-fashion-mnist
          libopenblas-dev gnuplot-nox python3 python3-numpy python3-dev pybind11-dev
          python3-pytest python3-torch libpcre2-dev libicu-dev libsentencepiece-dev sentencepiece python3-sentencepiece fortunes wamerican libcpp-httplib-dev libboost-dev curl iproute2 libgloo-dev "$@")
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
