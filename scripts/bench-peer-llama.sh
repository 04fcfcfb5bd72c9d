#!/usr/bin/env bash
# scripts/bench-peer-gpt.sh on a Llama-family decoder (default: the `--model llama` defaults): the
# PyTorch peer of the same architecture and dims is scripts/peer_llama.py.
# Usage: bash scripts/bench-peer-llama.sh [STEPS] [MODEL] [BATCH] [DTYPE]
set -euo pipefail
exec bash "$(dirname "$0")/bench-peer-gpt.sh" "${1:-600}" "${2:-llama}" "${3:-16}" "${4:-f32}"
