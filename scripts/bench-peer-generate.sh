#!/usr/bin/env bash
# meshtensor's generator against a PyTorch (Debian's python3-torch, CPU) incremental decoder of the
# same GPT with the same weights, read from one meshtensor checkpoint, in the same run, one thread
# each: greedy decoding of the same prompts at batch 1 and 16. Prints decode tokens/s (prefill
# excluded), their ratio (goal: meshtensor >= 1.5x PyTorch), how many generated tokens agree,
# and meshtensor's invariance cost and exact/ordered figures. Opt-in; not part of the test suite.
# Usage: bash scripts/bench-peer-generate.sh [MODEL] [TRAIN_STEPS] [NEW_TOKENS]
#        (defaults: gpt, 50 steps of training on Debian's fortunes, 64 new tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch-peer-setup.sh  # python, bin
model=${1:-gpt}
steps=${2:-50}
new_tokens=${3:-64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin" train --model "$model" --steps "$steps" --eval-every 0 --save "$work/ckpt" >/dev/null
"$bin" bench generate --checkpoint "$work/ckpt" --new-tokens "$new_tokens" --json >"$work/mesh.json"
"$python" -c '
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
json.dump({str(r["batch"]): r["prompts"] for r in rows}, open(sys.argv[2], "w"))
' "$work/mesh.json" "$work/prompts.json"
"$python" scripts/peer_generate.py --checkpoint "$work/ckpt" --prompts-json "$work/prompts.json" \
  --new-tokens "$new_tokens" --threads 1 >"$work/torch.json"
"$python" - "$work/mesh.json" "$work/torch.json" <<'PY'
import json, sys
mesh = json.load(open(sys.argv[1]))
torch = json.load(open(sys.argv[2]))
print(f"model {mesh['model']}, prompts of {mesh['prompt_tokens']} tokens, "
      f"{mesh['new_tokens']} new tokens, greedy, one thread each (PyTorch {torch['torch']})")
print(f"{'batch':>6} {'meshtensor tok/s':>17} {'PyTorch tok/s':>14} {'ratio':>7} "
      f"{'same tokens':>12} {'invariance cost':>16} {'exact/ordered':>14}")
for row in mesh["rows"]:
    peer = torch["batches"][str(row["batch"])]
    ours = [t for seq in row["tokens"] for t in seq]
    theirs = [t for seq in peer["tokens"] for t in seq]
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"{row['batch']:>6} {row['ordered_tokens_s']:>17.0f} {peer['decode_tokens_s']:>14.0f} "
          f"{row['ordered_tokens_s'] / peer['decode_tokens_s']:>6.2f}x {same:>5}/{len(ours):<6} "
          f"{row['invariance_cost']:>15.3f}x {row['exact_over_ordered']:>13.3f}x")
PY
