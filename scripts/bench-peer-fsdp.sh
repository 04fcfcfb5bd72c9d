#!/usr/bin/env bash
# meshtensor FSDP on 2 thread ranks against PyTorch's best use of the same 2 cores, training the
# same model (GPT or Llama-family) on the same batches of Debian's fortunes with the same
# hyperparameters: PyTorch runs DistributedDataParallel over Gloo with 2 processes of 1 thread,
# and 1 process of 2 threads; the ratio is against the faster of the two. Prints the training
# tokens/s (evaluation excluded) and the final validation losses, then one JSON line with
# `tokens_per_second_ratio`. Opt-in: installs python3-torch if missing; not part of the tests.
# With DTYPE bf16 both sides train in bf16 as scripts/bench-peer-gpt.sh describes.
# Usage: bash scripts/bench-peer-fsdp.sh [STEPS] [MODEL] [BATCH] [DTYPE]
#        (defaults: 300 steps of the `meshtensor train --model gpt` defaults, f32)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch-peer-setup.sh  # python, bin
steps=${1:-300}
model=${2:-gpt}
batch=${3:-16}
dtype=${4:-f32}
data=/usr/share/games/fortunes
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin" train --model "$model" --batch "$batch" --steps "$steps" --strategy fsdp --ranks 2 --json \
  --data "$data" --param-dtype "$dtype" --save "$work/ckpt" >"$work/mesh.json"
architecture=$(sed -n 's/^  architecture: //p' < <("$bin" checkpoint inspect "$work/ckpt"))
peer=(scripts/peer_gpt.py --data "$data" --architecture "$architecture" --batch "$batch"
      --steps "$steps" --lr 1e-3 --warmup 30 --eval-every 50 --seed 0 --dtype "$dtype")
"$python" "${peer[@]}" --threads 1 --ddp 2 | grep '^{' >"$work/ddp.json"
"$python" "${peer[@]}" --threads 2 | grep '^{' >"$work/threads.json"

"$python" - "$work/mesh.json" "$work/ddp.json" "$work/threads.json" "$model" "$steps" "$dtype" <<'PY'
import json, sys
mesh = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
reports = [r for r in mesh if not r.get("final")]
final = mesh[-1]
seconds = sum(r["seconds"] for r in reports)
mesh_tps = sum(r["tokens_per_second"] * r["seconds"] for r in reports) / seconds
ddp, threads = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
best = max((ddp, threads), key=lambda r: r["tokens_per_second"])
name = "DDP over Gloo, 2 processes of 1 thread" if best is ddp else "1 process of 2 threads"
print(f"{sys.argv[4]}, {sys.argv[5]} steps, {sys.argv[6]}, 2 cores")
print(f"tokens/s: meshtensor fsdp 2 ranks {mesh_tps:.0f}; pytorch ddp 2x1 "
      f"{ddp['tokens_per_second']:.0f}, 1x2 threads {threads['tokens_per_second']:.0f}: "
      f"{mesh_tps / best['tokens_per_second']:.2f}x the faster ({name})")
print(f"final validation loss: meshtensor {final['validation_loss']:.4f}, pytorch ddp "
      f"{ddp['validation_loss']:.4f}, threads {threads['validation_loss']:.4f}")
print(json.dumps({"dtype": sys.argv[6],
                  "meshtensor_tokens_per_second": mesh_tps,
                  "pytorch_ddp_tokens_per_second": ddp["tokens_per_second"],
                  "pytorch_threads_tokens_per_second": threads["tokens_per_second"],
                  "pytorch_best": name,
                  "tokens_per_second_ratio": mesh_tps / best["tokens_per_second"],
                  "meshtensor_validation_loss": final["validation_loss"],
                  "pytorch_validation_loss": best["validation_loss"]}))
PY
