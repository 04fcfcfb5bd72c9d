#!/usr/bin/env bash
# Folders of published models' configs as published (their widths, heads, vocabularies, RoPE
# settings and dtypes; two layers each, random weights: tests/hf/published_folders.py): each
# loads, generates, and generates the same bits on tensor-parallel ranks where its key/value
# heads split.
# Usage: published_shapes.sh <meshtensor>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$bin" tokenizer train --vocab 1000 --out "$dir/tok.json" >/dev/null
models=(qwen3-0.6b qwen2.5-0.5b llama-3.2-1b smollm2-135m tinyllama-1.1b gpt2)
/usr/bin/python3 "$(dirname "$0")/../hf/published_folders.py" "$dir" "$dir/tok.json" \
  "${models[@]/%/:layers=2}" >/dev/null
generated() {  # generated <folder> [options]: the tokens and logprobs of 6 greedy tokens
  local folder=$1
  shift
  "$bin" generate --checkpoint "hf:$folder" --prompt "The cat sat" --max-new-tokens 6 \
    --temperature 0 --mode exact --json "$@" |
    /usr/bin/python3 -c 'import json, sys; g = json.load(sys.stdin); print(g["tokens"], g["logprobs"])'
}
for model in "${models[@]}"; do
  folder="$dir/$model-layers2"
  one=$(generated "$folder") || fail "$model does not generate"
  case $model in
  smollm2-135m) echo "ok: $model generates (its 3 key/value heads do not split over 2 ranks)" ;;
  *)
    two=$(generated "$folder" --ranks 2) || fail "$model does not generate on tp 2"
    [ "$one" = "$two" ] || fail "$model: tp 2 generates otherwise: $one / $two"
    echo "ok: $model generates the same bits on 1 rank and on tp 2"
    ;;
  esac
done
