#!/usr/bin/env bash
# Fault-tolerant training across "hosts" made of network namespaces (scripts/multihost.sh): one
# replica group of 2 thread ranks on each of 3 hosts, the coordinator on this machine (the
# bridge's address), --replica-timeout and the heartbeat timeout 5 s, a checkpoint every 20
# steps. Root only: exit 77 (skipped) otherwise. Usage: replica_groups.sh <meshtensor> <case> [runs]
#   kill     host 2's group killed (SIGKILL) mid-run and started again, then host 3's
#   stop     host 3's processes stopped (SIGSTOP) past the timeouts, then continued
#   unplug   host 2 taken off the network past the timeouts, then put back
#   random   RUNS runs (default 20): in each, two groups in turn fail at a random moment (during a
#            forward, the cross-group join, a save or the other's heal) by a random kind of
#            failure (SIGKILL and a restart, SIGSTOP, a link taken down) and come back
# Every case: every group ends on the uninterrupted run's digests, no run takes more than 60 s
# past its failures, every checkpoint verifies.
set -uo pipefail
bin=$1
case_name=$2
runs=${3:-20}
here=$(cd "$(dirname "$0")" && pwd)
multihost=$here/../../scripts/multihost.sh
if [ "$(id -u)" != 0 ]; then
  echo "skipped: multi-host runs need root (network namespaces)"
  exit 77
fi
for tool in ip unshare; do
  command -v $tool >/dev/null || { echo "skipped: $tool is missing"; exit 77; }
done
dir=$(mktemp -d)
cleanup() {
  pkill -9 -f "$bin coordinator --host" 2>/dev/null
  bash "$multihost" down "$dir" >/dev/null 2>&1
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "FAILED: $*"
  exit 1
}
field() { sed -n "s/.*$1 \([0-9a-f]*\).*/\1/p" | head -1; }

bash "$multihost" up 3 "$dir" >"$dir/up.log" 2>&1 || {
  cat "$dir/up.log"
  echo "skipped: cannot create network namespaces here"
  exit 77
}
bridge=$(bash "$multihost" bridge "$dir")
steps=240
run=(train --mode exact --model gpt:layers=2,heads=2,dim=32,context=30 --batch 6 --seed 3
     --no-sample --eval-every 20 --steps $steps)
want=$("$bin" "${run[@]}" --ranks 1 | field "weights digest")
[ -n "$want" ] || fail "the uninterrupted run printed no digest"

# group RUN HOST: starts host HOST's group of run RUN (output appended to $dir/RUN/hHOST).
group() {
  local r=$1 h=$2
  bash "$multihost" exec "$dir" "$h" -- "$bin" "${run[@]}" --ranks 2 --replica-groups 3 \
    --replica-group $((h - 1)) --coordinator "$bridge:$port" --replica-timeout 5 \
    --save "$dir/$r/checkpoints" --save-every 20 >>"$dir/$r/h$h" 2>&1 &
  eval "pid_$h=$!"
}

# reached RUN STEP: waits (60 s at most) until the coordinator's groups are at STEP.
reached() {
  for _ in $(seq 600); do
    local last
    last=$(cat "$dir/$1"/h* 2>/dev/null | sed -n 's/^step *\([0-9]*\) .*/\1/p' | sort -n | tail -1)
    [ -n "$last" ] && [ "$last" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "run $1 did not reach step $2"
}

# fail_group RUN HOST KIND: HOST's group fails by KIND (kill, stop, unplug) and comes back.
fail_group() {
  local r=$1 h=$2 kind=$3
  echo "run $r: $kind host $h"
  case $kind in
  kill)
    local pid_var="pid_$h"
    bash "$multihost" kill "$dir" "$h" >/dev/null
    wait "${!pid_var}" 2>/dev/null
    sleep 0.$((RANDOM % 10))
    group "$r" "$h"
    ;;
  stop)
    bash "$multihost" stop "$dir" "$h" >/dev/null
    sleep 7
    bash "$multihost" cont "$dir" "$h" >/dev/null
    ;;
  unplug)
    bash "$multihost" unplug "$dir" "$h" >/dev/null
    sleep 7
    bash "$multihost" plug "$dir" "$h" >/dev/null
    ;;
  esac
}

# one_run RUN KIND1 HOST1 STEP1 KIND2 HOST2 STEP2: a run with two failures.
one_run() {
  local r=$1
  mkdir -p "$dir/$r"
  "$bin" coordinator --host "$bridge" --port 0 --heartbeat-timeout 5 >"$dir/$r/coordinator" 2>&1 &
  local coordinator=$!
  for _ in $(seq 100); do
    port=$(sed -n "s/.*listening on [0-9.]*:\([0-9]*\).*/\1/p" "$dir/$r/coordinator")
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || fail "the coordinator did not start: $(cat "$dir/$r/coordinator")"
  for h in 1 2 3; do group "$r" "$h"; done
  reached "$r" "$4"
  sleep 0.$((RANDOM % 10))
  fail_group "$r" "$3" "$2"
  reached "$r" "$7"
  sleep 0.$((RANDOM % 10))
  fail_group "$r" "$6" "$5"
  local started=$SECONDS
  for h in 1 2 3; do
    local pid_var="pid_$h"
    while kill -0 "${!pid_var}" 2>/dev/null; do
      [ $((SECONDS - started)) -lt 60 ] || fail "run $r: host $h's group still runs 60 s after the failures: $(tail -3 "$dir/$r/h$h")"
      sleep 0.2
    done
    wait "${!pid_var}" || fail "run $r: host $h's group exited $?: $(tail -5 "$dir/$r/h$h")"
  done
  kill "$coordinator"
  wait "$coordinator" 2>/dev/null
  for h in 1 2 3; do
    local got
    got=$(field "weights digest" <"$dir/$r/h$h")
    [ "$got" = "$want" ] || fail "run $r: host $h's group ended on '$got', the uninterrupted run on $want: $(tail -5 "$dir/$r/h$h")"
  done
  local count=0
  for c in "$dir/$r"/checkpoints/step-*; do
    "$bin" checkpoint verify "$c" >/dev/null || fail "run $r: checkpoint $c does not verify"
    count=$((count + 1))
  done
  [ $count -ge 3 ] || fail "run $r: only $count checkpoints: $(ls "$dir/$r/checkpoints")"
  echo "ok: run $r: every group on $want, $count checkpoints verify"
}

case $case_name in
kill) one_run kill kill 2 40 kill 3 120 ;;
stop) one_run stop stop 3 40 kill 2 140 ;;
unplug) one_run unplug unplug 2 40 stop 3 140 ;;
random)
  kinds=(kill stop unplug)
  for r in $(seq "$runs"); do
    first=$((RANDOM % 3 + 1))
    second=$(((first + RANDOM % 2) % 3 + 1))
    one_run "random$r" "${kinds[RANDOM % 3]}" "$first" $((20 + RANDOM % 40)) \
      "${kinds[RANDOM % 3]}" "$second" $((100 + RANDOM % 60))
  done
  ;;
*) fail "unknown case $case_name" ;;
esac
echo "passed: $case_name"
