#!/usr/bin/env bash
# Fault-tolerant training from the command line: replica groups as separate processes on this
# machine with a coordinator. Usage: replica_groups.sh <meshtensor> <case> [mpirun...]
#   exact        3 groups of fsdp 2, 2 groups of tp 2 (sequence parallel), 2 groups of cp 2, 2
#                groups of pp 2, 2 groups of ddp 2 (replicas inside and across groups), 3 groups
#                on a batch of 7 (uneven shares), 3 groups of a Llama with gradient clipping and
#                reduce-scatter micro-batches: every group ends on the 1-rank digests
#   kill         3 groups; one killed (SIGKILL) and restarted, then another: the survivors go on,
#                the restarted ones heal from a live peer, every group ends on the 1-rank digests
#   stop         a group stopped (SIGSTOP) past the timeouts, then continued: it joins again and
#                heals; every group ends on the 1-rank digests
#   ordered      ordered mode with a group killed and restarted: every group ends identical
#   coordinator  the coordinator killed mid-run: the groups go on in their quorum, saying so, and
#                end on the 1-rank digests; restarted mid-run: they go on with it
#   checkpoint   checkpoints saved while a group is missing verify, and resume on 1 rank to the
#                uninterrupted digests
#   mpi          2 groups of 2 mpi processes each (mpirun command after the case), one killed and
#                restarted: every group ends on the 1-rank digests
#   errors       a group of another model or layout, a group joined twice, a group out of range,
#                another group count, an unreachable coordinator: clear errors naming them, and
#                the running groups go on
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../cli/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
[ -n "${KEEP_DIR:-}" ] && trap - EXIT && echo "dir $dir"

run=(train --mode exact --model gpt:layers=2,heads=2,dim=32,context=30 --batch 6 --seed 3
     --no-sample --eval-every 20)

# coordinator [PORT] [OPTIONS]: starts one; sets $port and $coordinator (its pid).
coordinator() {
  local want=${1:-0}
  shift || true
  "$bin" coordinator --host 127.0.0.1 --port "$want" "$@" >"$dir/coordinator.log" 2>&1 &
  coordinator=$!
  disown "$coordinator"  # killed on purpose: no job report
  pids+=("$coordinator")
  for _ in $(seq 100); do
    port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$dir/coordinator.log")
    [ -n "$port" ] && return
    sleep 0.1
  done
  fail "the coordinator did not start: $(cat "$dir/coordinator.log")"
}

# group NAME INDEX ARGS...: starts replica group INDEX of the run in ARGS; output in $dir/NAME.
group() {
  local name=$1 index=$2
  shift 2
  "$bin" "$@" --replica-group "$index" --coordinator "127.0.0.1:$port" >"$dir/$name" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}

# wait_step NAME STEP: waits (60 s at most) until group NAME reported STEP or later.
wait_step() {
  for _ in $(seq 600); do
    local last
    last=$(tr '\r' '\n' <"$dir/$1" | sed -n 's/^ *step *\([0-9]*\) .*/\1/p' | tail -1)
    [ -n "$last" ] && [ "$last" -ge "$2" ] && return
    sleep 0.1
  done
  fail "group $1 did not reach step $2: $(tail -5 "$dir/$1")"
}

# finish NAME...: waits (120 s at most each) for the groups and fails unless each exited 0.
finish() {
  for name in "$@"; do
    local pid_var="pid_$name"
    local waited=0
    while kill -0 "${!pid_var}" 2>/dev/null; do
      sleep 0.2
      waited=$((waited + 1))
      [ $waited -lt 600 ] || fail "group $name still runs after 120 s: $(tail -5 "$dir/$name")"
    done
    wait "${!pid_var}" || fail "group $name exited $?: $(tail -5 "$dir/$name")"
  done
}

# same_digests WANT WHAT NAME...: every group NAME printed the digests WANT.
same_digests() {
  local want=$1 what=$2
  shift 2
  for name in "$@"; do
    same "$want" "$(field "weights digest" <"$dir/$name") $(field "logits digest" <"$dir/$name")" \
      "$what: group $name"
  done
  echo "ok: $what: $want"
}

case $case_name in
exact)
  one=$(digests "$bin" "${run[@]}" --steps 8 --ranks 1)
  coordinator
  for g in 0 1 2; do group "fsdp$g" $g "${run[@]}" --steps 8 --ranks 2 --replica-groups 3; done
  finish fsdp0 fsdp1 fsdp2
  same_digests "$one" "3 groups of fsdp 2" fsdp0 fsdp1 fsdp2
  for g in 0 1; do
    group "tp$g" $g "${run[@]}" --steps 8 --mesh 2 --names tp --sequence-parallel \
      --replica-groups 2
  done
  finish tp0 tp1
  same_digests "$one" "2 groups of tp 2" tp0 tp1
  for g in 0 1; do group "cp$g" $g "${run[@]}" --steps 8 --mesh 2 --names cp --replica-groups 2; done
  finish cp0 cp1
  same_digests "$one" "2 groups of cp 2" cp0 cp1
  for g in 0 1; do
    group "pp$g" $g "${run[@]}" --steps 8 --mesh 2 --names pp --micro-batches 2 --replica-groups 2
  done
  finish pp0 pp1
  same_digests "$one" "2 groups of pp 2" pp0 pp1
  for g in 0 1; do group "ddp$g" $g "${run[@]}" --steps 8 --ranks 2 --strategy ddp --replica-groups 2; done
  finish ddp0 ddp1
  same_digests "$one" "2 groups of ddp 2" ddp0 ddp1
  run7=(train --mode exact --model gpt:layers=2,heads=2,dim=32,context=30 --batch 7 --seed 3
        --no-sample --steps 8)
  seven=$(digests "$bin" "${run7[@]}" --ranks 1)
  for g in 0 1 2; do group "seven$g" $g "${run7[@]}" --ranks 1 --replica-groups 3; done
  finish seven0 seven1 seven2
  same_digests "$seven" "3 groups on a batch of 7" seven0 seven1 seven2
  llama=(train --mode exact --model llama:layers=2,heads=4,kv_heads=2,dim=32,context=24,qk_norm=1
         --batch 5 --seed 5 --no-sample --steps 6 --clip-grad-norm 0.3)
  want=$(digests "$bin" "${llama[@]}" --ranks 1)
  for g in 0 1 2; do
    group "llama$g" $g "${llama[@]}" --ranks 2 --micro-batches 3 --micro-batch-mode reduce-scatter \
      --replica-groups 3
  done
  finish llama0 llama1 llama2
  same_digests "$want" "3 groups of a clipped Llama, reduce-scatter micro-batches" llama0 llama1 llama2
  ;;
kill)
  one=$(digests "$bin" "${run[@]}" --steps 200 --ranks 1)
  coordinator
  for g in 0 1 2; do group "g$g" $g "${run[@]}" --steps 200 --ranks 2 --replica-groups 3; done
  wait_step g0 40
  kill -9 "$pid_g1"
  wait_step g0 60
  group g1b 1 "${run[@]}" --steps 200 --ranks 2 --replica-groups 3
  wait_step g1b 100
  kill -9 "$pid_g2"
  wait_step g0 140
  group g2b 2 "${run[@]}" --steps 200 --ranks 2 --replica-groups 3
  finish g0 g1b g2b
  same_digests "$one" "3 groups, 2 killed and healed" g0 g1b g2b
  grep -q "healed" "$dir/g1b" || fail "group 1 does not say it healed: $(cat "$dir/g1b")"
  ;;
stop)
  one=$(digests "$bin" "${run[@]}" --steps 200 --ranks 1)
  coordinator 0 --heartbeat-timeout 2
  for g in 0 1 2; do
    group "g$g" $g "${run[@]}" --steps 200 --ranks 2 --replica-groups 3 --replica-timeout 2
  done
  wait_step g0 40
  kill -STOP "$pid_g2"
  wait_step g0 80
  kill -CONT "$pid_g2"
  finish g0 g1 g2
  same_digests "$one" "a group stopped past the timeouts and continued" g0 g1 g2
  ;;
ordered)
  ordered=(train --mode ordered --model gpt:layers=2,heads=2,dim=32,context=30 --batch 6 --seed 3
           --no-sample --eval-every 20 --steps 120 --ranks 2 --replica-groups 3)
  coordinator
  for g in 0 1 2; do group "g$g" $g "${ordered[@]}"; done
  wait_step g0 40
  kill -9 "$pid_g1"
  wait_step g0 60
  group g1b 1 "${ordered[@]}"
  finish g0 g1b g2
  want="$(field "weights digest" <"$dir/g0") $(field "logits digest" <"$dir/g0")"
  same_digests "$want" "ordered mode, a group killed and healed: identical groups" g0 g1b g2
  ;;
coordinator)
  one=$(digests "$bin" "${run[@]}" --steps 200 --ranks 1)
  coordinator
  for g in 0 1; do group "g$g" $g "${run[@]}" --steps 200 --ranks 1 --replica-groups 2; done
  wait_step g0 40
  kill -9 "$coordinator"
  wait_step g0 80
  coordinator "$port"
  wait_step g0 120
  finish g0 g1
  same_digests "$one" "the coordinator killed and restarted" g0 g1
  grep -q "coordinator 127.0.0.1:$port unreachable at step" "$dir/g0" ||
    fail "group 0 does not name the lost coordinator: $(cat "$dir/g0")"
  ;;
mpi)
  shift 2
  one=$(digests "$bin" "${run[@]}" --steps 160 --ranks 1)
  coordinator
  mpi_group() {
    "$@" -np 2 "$bin" "${run[@]}" --steps 160 --backend mpi --replica-groups 2 \
      --replica-group "$index" --coordinator "127.0.0.1:$port" >"$dir/$name" 2>&1 &
    pids+=($!)
    eval "pid_$name=$!"
  }
  index=0 name=m0 mpi_group "$@"
  index=1 name=m1 mpi_group "$@"
  wait_step m0 40
  kill -9 "$pid_m1"
  pkill -9 -f "replica-group 1 --coordinator 127.0.0.1:$port" || true
  wait "$pid_m1" 2>/dev/null || true
  wait_step m0 80
  index=1 name=m1b mpi_group "$@"
  finish m0 m1b
  same_digests "$one" "2 groups of 2 mpi processes, one killed and healed" m0 m1b
  ;;
checkpoint)
  one=$(digests "$bin" "${run[@]}" --steps 120 --ranks 1)
  coordinator
  for g in 0 1; do
    group "g$g" $g "${run[@]}" --steps 120 --ranks 2 --replica-groups 2 --save "$dir/ckpt" \
      --save-every 20
  done
  wait_step g0 30
  kill -9 "$pid_g0"  # the group that saved
  wait_step g1 70
  group g0b 0 "${run[@]}" --steps 120 --ranks 2 --replica-groups 2 --save "$dir/ckpt" \
    --save-every 20
  finish g1 g0b
  same_digests "$one" "checkpoints while a group is missing" g1 g0b
  count=0
  for c in "$dir"/ckpt/step-*; do
    "$bin" checkpoint verify "$c" >/dev/null || fail "checkpoint $c does not verify"
    count=$((count + 1))
  done
  [ $count -ge 4 ] || fail "only $count checkpoints saved: $(ls "$dir/ckpt")"
  same "$one" "$(digests "$bin" "${run[@]}" --steps 120 --ranks 1 --resume "$dir/ckpt/step-00000080")" \
    "resumed on 1 rank from step 80, saved while group 0 was away"
  ;;
errors)
  coordinator
  for g in 0 1; do group "g$g" $g "${run[@]}" --steps 150 --ranks 2 --replica-groups 3; done
  wait_step g0 20
  expect 2 "replica group 2 runs another model, layout or settings than the run's groups: 'model gpt layers=2 heads=4 dim=32 context=30 .*' where they have 'model gpt layers=2 heads=2 dim=32" \
    "$bin" train --mode exact --model gpt:layers=2,heads=4,dim=32,context=30 --batch 6 --seed 3 \
    --steps 150 --ranks 2 --replica-groups 3 --replica-group 2 --coordinator "127.0.0.1:$port"
  expect 2 "'layout 1x1x2 (dp x fsdp x tp)' where they have 'layout fsdp over 2 ranks'" \
    "$bin" "${run[@]}" --steps 150 --mesh 2 --names tp --replica-groups 3 --replica-group 2 \
    --coordinator "127.0.0.1:$port"
  expect 2 "replica group 1 joined twice: it is live already" \
    "$bin" "${run[@]}" --steps 150 --ranks 2 --replica-groups 3 --replica-group 1 \
    --coordinator "127.0.0.1:$port"
  expect 2 "says the run has 4 groups" \
    "$bin" "${run[@]}" --steps 150 --ranks 2 --replica-groups 4 --replica-group 3 \
    --coordinator "127.0.0.1:$port"
  expect 2 "replica group 3 is not one of the run's 3 groups (0 .. 2)" \
    "$bin" "${run[@]}" --steps 150 --ranks 2 --replica-groups 3 --replica-group 3 \
    --coordinator "127.0.0.1:$port"
  expect 2 "'127.0.0.1' is not HOST:PORT" \
    "$bin" "${run[@]}" --steps 150 --ranks 2 --replica-groups 3 --replica-group 2 \
    --coordinator 127.0.0.1
  kill -9 "$coordinator"
  expect 2 "replica group 2 cannot reach its coordinator 127.0.0.1:$port: cannot connect" \
    "$bin" "${run[@]}" --steps 150 --ranks 2 --replica-groups 3 --replica-group 2 \
    --coordinator "127.0.0.1:$port"
  coordinator "$port"
  finish g0 g1
  one=$(digests "$bin" "${run[@]}" --steps 150 --ranks 1)
  same_digests "$one" "the running groups after the refusals" g0 g1
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
echo "passed: $case_name"
