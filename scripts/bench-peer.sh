#!/usr/bin/env bash
# meshtensor against PyTorch (Debian's python3-torch, CPU) on the same job, cores and run: the
# default `meshtensor train` model (784-1024-1024-10 MLP, ReLU, AdamW 1e-3 with a cosine schedule,
# global batch 256) on Fashion-MNIST for the same epochs, in two setups:
#   one process:  PyTorch with one intra-op thread per rank  vs  meshtensor, ranks as threads
#   processes:    PyTorch DDP over gloo (torch.multiprocessing.spawn)  vs  meshtensor under mpirun
# then meshtensor in exact mode (threads). Prints training samples/s (evaluation excluded), test
# accuracy and the ratios. Opt-in: installs python3-torch if missing; not part of the test suite.
# Usage: bash scripts/bench-peer.sh [EPOCHS] [RANKS]   (defaults: 8 epochs, 2 ranks)
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-8}
ranks=${2:-2}
# Debian's interpreter: python3-torch installs for it, whatever python3 comes first on PATH.
source scripts/torch-peer-setup.sh  # python, bin
mpirun_flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root)
results=$(mktemp)
trap 'rm -f "$results"' EXIT

# Runs a command that prints JSON lines and records its figures under a label. For meshtensor
# (--json) the samples/s are the epochs' samples over their training seconds.
record() {
  local key=$1 label=$2
  shift 2
  echo "-- $label" >&2
  "$@" | "$python" -c '
import json, sys
key, label = sys.argv[1], sys.argv[2]
lines = [json.loads(l) for l in sys.stdin if l.startswith("{")]
last = lines[-1]
if "samples_per_second" not in last or last.get("final"):
    epochs = [l for l in lines if not l.get("final")]
    seconds = sum(e["seconds"] for e in epochs)
    last = {"samples_per_second": sum(e["samples_per_second"] * e["seconds"] for e in epochs) / seconds,
            "test_accuracy": last["test_accuracy"], "digest": last["digest"]}
print(json.dumps({"key": key, "label": label, **last}))' "$key" "$label" >>"$results"
}

echo "== $epochs epoch(s), $ranks ranks, $(nproc) cores"
record torch_single "pytorch, one process, $ranks threads" \
  "$python" scripts/peer_torch.py single --epochs "$epochs" --ranks "$ranks"
record mesh_threads "meshtensor ordered, one process, $ranks rank threads" \
  "$bin" train --epochs "$epochs" --ranks "$ranks" --json
record torch_ddp "pytorch DDP over gloo, $ranks processes" \
  "$python" scripts/peer_torch.py ddp --epochs "$epochs" --ranks "$ranks"
record mesh_mpi "meshtensor ordered, mpi, $ranks processes" \
  mpirun "${mpirun_flags[@]}" -np "$ranks" "$bin" train --backend mpi --epochs "$epochs" --json
record mesh_exact "meshtensor exact, one process, $ranks rank threads" \
  "$bin" train --epochs "$epochs" --ranks "$ranks" --mode exact --json

"$python" - "$results" <<'PY'
import json, sys
runs = {r["key"]: r for r in map(json.loads, open(sys.argv[1]))}
print(f"{'setup':<48} {'samples/s':>10} {'test acc':>9}")
for r in runs.values():
    print(f"{r['label']:<48} {r['samples_per_second']:>10.0f} {r['test_accuracy']:>9.4f}")
def ratio(a, b):
    return runs[a]["samples_per_second"] / runs[b]["samples_per_second"]
print(f"meshtensor / pytorch, one process:   {ratio('mesh_threads', 'torch_single'):.2f}x  (goal: at least 1)")
print(f"meshtensor / pytorch DDP, processes: {ratio('mesh_mpi', 'torch_ddp'):.2f}x  (goal: at least 1)")
print(f"exact / ordered step time:           {ratio('mesh_threads', 'mesh_exact'):.2f}x  (goal: at most 3)")
PY
