#!/usr/bin/env bash
# A model at scale: a GPT of about 25M parameters (8 layers, dim 512, 8 heads, context 512) trains
# with FSDP on 2 mpi ranks (one process each, so each process's peak resident memory is one
# rank's), against PyTorch (Debian's python3-torch, CPU) training the same architecture on the same
# batches with 2 threads on the same cores. Prints meshtensor's tokens/s, model FLOP/s, MFU, step
# profile and memory per rank (the memory model's peak by kind, and the process's peak resident
# set against it), PyTorch's tokens/s and the ratio. Both exclude the first two steps. Opt-in:
# installs python3-torch if missing; not part of the test suite.
# Usage: bash scripts/bench-scale.sh [STEPS] [MODEL] [BATCH]
#        (defaults: 6 steps of gpt:layers=8,heads=8,dim=512,context=512, global batch 8)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch-peer-setup.sh  # python, bin
steps=${1:-6}
model=${2:-gpt:layers=8,heads=8,dim=512,context=512}
batch=${3:-8}
data=/usr/share/games/fortunes
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun_flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root)

mpirun "${mpirun_flags[@]}" -np 2 "$bin" train --backend mpi --strategy fsdp --model "$model" --batch "$batch" \
  --steps "$steps" --eval-every 0 --json --data "$data" --save "$work/ckpt" >"$work/mesh.json"
architecture=$(sed -n 's/^  architecture: //p' < <("$bin" checkpoint inspect "$work/ckpt"))
"$python" scripts/peer_gpt.py --data "$data" --architecture "$architecture" --batch "$batch" \
  --steps "$steps" --lr 1e-3 --warmup 1 --eval-every "$steps" --seed 0 --threads 2 \
  --timed-from 2 >"$work/torch.json"

"$python" - "$work/mesh.json" "$work/torch.json" "$architecture" "$steps" "$batch" <<'PY'
import json, sys
final = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")][-1]
torch = json.load(open(sys.argv[2]))
tokens = final["model_flops_per_second"] / final["model_flops_per_target"]
memory = final["peak_memory_bytes"]
counted = memory["total"]  # sharded state, gathered parameters and activations at their peak
resident = final["process_peak_resident_bytes"]
mib = 1 << 20
print(f"{sys.argv[3]}: {final['parameters']:,} parameters, global batch {sys.argv[5]}, "
      f"{sys.argv[4]} steps, FSDP on 2 mpi ranks; PyTorch with 2 threads")
print(f"meshtensor: {tokens:,.0f} tokens/s, {final['model_flops_per_second'] / 1e9:.1f} model "
      f"GFLOP/s, MFU {100 * final['mfu']:.1f}% of {final['peak_flops_per_second'] / 1e9:.0f} "
      f"GFLOP/s")
profile = final["profile"]["seconds_per_step"]
print("  profile of rank 0, ms a step: " +
      ", ".join(f"{k} {1e3 * v:.1f}" for k, v in profile.items()))
print(f"  memory of rank 0: parameters {memory['parameters'] / mib:.0f} MiB, gradients "
      f"{memory['gradients'] / mib:.0f} MiB, optimizer {memory['optimizer_state'] / mib:.0f} "
      f"MiB, gathered parameters {memory['unsharded'] / mib:.0f} MiB, activations "
      f"{memory['activations'] / mib:.0f} MiB: peak {counted / mib:.0f} MiB; "
      f"process peak resident {resident / mib:.0f} MiB = {resident / counted:.2f}x (goal: at "
      f"most 1.3x)")
print(f"pytorch: {torch['tokens_per_second']:,.0f} tokens/s; meshtensor / pytorch "
      f"{tokens / torch['tokens_per_second']:.2f}x (goal: at least 2.5x)")
print(json.dumps({"meshtensor_tokens_per_second": tokens, "mfu": final["mfu"],
                  "pytorch_tokens_per_second": torch["tokens_per_second"],
                  "counted_bytes": counted, "process_peak_resident_bytes": resident}))
PY
