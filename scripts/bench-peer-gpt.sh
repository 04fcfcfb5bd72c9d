#!/usr/bin/env bash
# meshtensor against PyTorch (Debian's python3-torch, CPU) training the same model (a GPT, or a
# Llama-family decoder with scripts/peer_llama.py; bench-peer-llama.sh) on the same
# batches of Debian's fortunes with the same hyperparameters, in one process with one thread
# each: meshtensor ordered on 1 rank, PyTorch with torch.set_num_threads(1) (scripts/peer_gpt.py
# takes its batches from meshtensor's Text.windows). Prints the training tokens/s (evaluation
# excluded) and the validation loss after each evaluation, and their ratios. Opt-in: installs
# python3-torch if missing; not part of the test suite.
# With DTYPE bf16, meshtensor trains with --param-dtype bf16 (bf16 products) and PyTorch under
# torch.autocast("cpu", torch.bfloat16) (the weights and optimizer f32 on both sides).
# Usage: bash scripts/bench-peer-gpt.sh [STEPS] [MODEL] [BATCH] [DTYPE]
#        (defaults: 600 steps of the `meshtensor train --model gpt` defaults, f32)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch-peer-setup.sh  # python, bin
steps=${1:-600}
model=${2:-gpt}
batch=${3:-16}
dtype=${4:-f32}
data=/usr/share/games/fortunes
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The model as meshtensor resolves it: the architecture its checkpoint records.
"$bin" train --model "$model" --batch "$batch" --steps "$steps" --ranks 1 --json --data "$data" \
  --param-dtype "$dtype" --save "$work/ckpt" >"$work/mesh.json"
architecture=$(sed -n 's/^  architecture: //p' < <("$bin" checkpoint inspect "$work/ckpt"))
"$python" scripts/peer_gpt.py --data "$data" --architecture "$architecture" --batch "$batch" \
  --steps "$steps" --lr 1e-3 --warmup 30 --eval-every 50 --seed 0 --threads 1 --dtype "$dtype" \
  >"$work/torch.json"

"$python" - "$work/mesh.json" "$work/torch.json" "$model" "$steps" "$dtype" <<'PY'
import json, sys
mesh = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
reports = [r for r in mesh if not r.get("final")]
final = mesh[-1]
seconds = sum(r["seconds"] for r in reports)
mesh_tps = sum(r["tokens_per_second"] * r["seconds"] for r in reports) / seconds
torch = json.load(open(sys.argv[2]))
print(f"{sys.argv[3]}, {sys.argv[4]} steps, {sys.argv[5]}, one process, one thread each")
print(f"{'step':>6} {'meshtensor val loss':>20} {'pytorch val loss':>17}")
for r, t in zip(reports, torch["evaluations"]):
    print(f"{r['steps']:>6} {r['validation_loss']:>20.4f} {t['validation_loss']:>17.4f}")
print(f"tokens/s: meshtensor {mesh_tps:.0f}, pytorch {torch['tokens_per_second']:.0f}: "
      f"{mesh_tps / torch['tokens_per_second']:.2f}x")
ratio = final["validation_loss"] / torch["validation_loss"]
print(f"final validation loss: meshtensor {final['validation_loss']:.4f}, pytorch "
      f"{torch['validation_loss']:.4f}: {ratio:.4f} (goal: within 2%, at most pytorch's)")
print(json.dumps({"dtype": sys.argv[5],
                  "meshtensor_tokens_per_second": mesh_tps,
                  "pytorch_tokens_per_second": torch["tokens_per_second"],
                  "tokens_per_second_ratio": mesh_tps / torch["tokens_per_second"],
                  "meshtensor_validation_loss": final["validation_loss"],
                  "pytorch_validation_loss": torch["validation_loss"],
                  "validation_loss_ratio": ratio}))
PY
