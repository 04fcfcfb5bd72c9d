#!/usr/bin/env bash
# Crash safety of `meshtensor train --save`: a run is killed (SIGKILL, as a preemption) while it
# saves, at each point of the save where a crash could do harm, on every rank or on one; then the
# checkpoint root must verify, LATEST must name a complete checkpoint (the previous one, or the
# new one once LATEST was replaced), and resuming from it must end on the digest of the run that
# was never stopped.
# Usage: checkpoint_crash.sh <meshtensor binary> points|random|mpi [mpirun command...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
mode=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT


# The first 6000 training and 1000 test images of Fashion-MNIST as plain IDX files: every run
# below starts a process, and reading the whole set each time would dominate the test.
python=/usr/bin/python3
[ -x "$python" ] || python=python3
"$python" - "$dir/data" <<'PY'
import gzip, os, struct, sys
out = sys.argv[1]
os.makedirs(out)
for name, count in (("train", 6000), ("t10k", 1000)):
    for kind, header in (("images-idx3-ubyte", 16), ("labels-idx1-ubyte", 8)):
        with gzip.open(f"/usr/share/datasets/fashion-mnist/{name}-{kind}.gz") as f:
            blob = f.read()
        item = 784 if header == 16 else 1
        head = blob[:4] + struct.pack(">I", count) + blob[8:header]
        with open(os.path.join(out, f"{name}-{kind}"), "wb") as f:
            f.write(head + blob[header:header + count * item])
PY
run=(train --data "$dir/data" --model mlp:32,16 --batch 1000 --steps 16 --seed 5 --strategy fsdp --ranks 4)
"$bin" "${run[@]}" --stop-after 4 --save "$dir/base" >/dev/null
whole=$("$bin" "${run[@]}" | field "weights digest")

# After a crash: the root verifies, LATEST names what it should, and (unless told "quick") what
# LATEST names resumes to the same end.
check_root() {
  local root=$1 label=$2 expect_latest=$3 quick=${4:-}
  "$bin" checkpoint verify "$root" >/dev/null || { echo "FAILED: $label: verify"; "$bin" checkpoint verify "$root"; exit 1; }
  local latest
  latest=$(cat "$root/LATEST")
  if [ -n "$expect_latest" ] && [ "$latest" != "$expect_latest" ]; then
    echo "FAILED: $label: LATEST is $latest, expected $expect_latest"
    exit 1
  fi
  if [ -n "$quick" ]; then
    echo "ok: $label: LATEST $latest intact and verified"
    return
  fi
  local resumed
  resumed=$("$bin" "${run[@]}" --resume "$root" | field "weights digest")
  if [ "$resumed" != "$whole" ]; then
    echo "FAILED: $label: resumed from $latest to digest '$resumed', expected $whole"
    exit 1
  fi
  echo "ok: $label: LATEST $latest intact, resumes to $resumed"
}

# Runs a resumed save that must die by SIGKILL (137 from the shell, or a failure from mpirun).
expect_killed() {
  local label=$1
  shift
  set +e
  "$@" >"$dir/out.txt" 2>&1
  local status=$?
  set -e
  if [ "$status" = 0 ]; then
    echo "FAILED: $label: the run was not killed"
    cat "$dir/out.txt"
    exit 1
  fi
}

case $mode in
points)
  for point in before_write mid_write after_write before_index before_rename before_latest after_latest; do
    for who in "" "@2" "@0"; do
      case "$point$who" in
        before_index@2 | before_rename@2 | before_latest@2 | after_latest@2) continue ;;  # rank 0's steps
      esac
      root="$dir/root-$point${who#@}"
      cp -r "$dir/base" "$root"
      expect_killed "$point$who" env MESHTENSOR_FAILPOINT="checkpoint.$point$who" \
        "$bin" "${run[@]}" --resume "$root" --stop-after 8 --save "$root"
      expected=step-00000004
      [ "$point" = after_latest ] && expected=step-00000008
      # Resuming is checked once per point (killing every rank); the single-rank kills verify.
      check_root "$root" "killed at $point$who" "$expected" "$who"
      rm -rf "$root"
    done
  done
  ;;
random)
  # A larger model saved every step, killed from outside at moments during and after a save.
  big=(train --data "$dir/data" --model mlp:1024,1024 --batch 1000 --steps 60 --seed 5 --strategy fsdp --ranks 4)
  "$bin" "${big[@]}" --stop-after 1 --save "$dir/big-base" >/dev/null
  for delay in 0 0 0.01 0.02 0.05; do
    rm -rf "$dir/big"
    cp -r "$dir/big-base" "$dir/big"
    "$bin" "${big[@]}" --resume "$dir/big" --save "$dir/big" --save-every 1 --keep-checkpoints 2 >/dev/null 2>&1 &
    pid=$!
    # Wait until the run saves (a temporary directory appears), then kill it a little later.
    for _ in $(seq 30000); do
      compgen -G "$dir/big/.tmp-*" >/dev/null && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.002
    done
    sleep "$delay"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    "$bin" checkpoint verify "$dir/big" >/dev/null || { echo "FAILED: killed ${delay}s into a save"; "$bin" checkpoint verify "$dir/big"; exit 1; }
    echo "ok: killed ${delay}s after a save began: $(cat "$dir/big/LATEST") verifies ($(ls -a "$dir/big" | tr '\n' ' '))"
  done
  # The next save clears what the killed ones left behind.
  latest=$(sed 's/step-0*\([0-9][0-9]*\).*/\1/' "$dir/big/LATEST")
  "$bin" "${big[@]}" --resume "$dir/big" --save "$dir/big" --stop-after $((latest + 1)) >/dev/null
  if ls -a "$dir/big" | grep -q '^\.tmp-'; then
    echo "FAILED: leftovers of killed saves remain: $(ls -a "$dir/big")"
    exit 1
  fi
  echo "ok: the next save removed the leftovers"
  ;;
mpi)
  # One process of an mpi job dies in the middle of writing its file; mpirun ends the others.
  root="$dir/root-mpi"
  cp -r "$dir/base" "$root"
  mpi_run=(train --data "$dir/data" --model mlp:32,16 --batch 1000 --steps 16 --seed 5 --strategy fsdp)
  expect_killed "mpi mid_write@1" env MESHTENSOR_FAILPOINT=checkpoint.mid_write@1 \
    "$@" -np 4 "$bin" "${mpi_run[@]}" --backend mpi --resume "$root" --stop-after 8 --save "$root"
  check_root "$root" "mpi rank 1 killed while writing" step-00000004
  ;;
esac
