#!/usr/bin/env bash
# OpenMPI across "hosts" made of network namespaces (scripts/multihost.sh). Root only: exit 77
# (skipped) otherwise. Usage: multihost.sh <meshtensor> <case>
#   detect    3 hosts x 4 ranks: check finds 3 hosts, exact digests equal the threads backend's
#             (with and without the same topology given to it), seed 000 scaled down (mesh 4x3)
#   train     2 hosts x 2 ranks: exact FSDP, HSDP and TP training digests equal threads'
#   jagged    3 hosts x 4 ranks, (ddp=4, fsdp=3): ordered training keeps replicas identical and
#             gathers the parameters on each host; a redistribute over groups of 12 (8 + 4
#             ranks) in jagged two levels: exact bits
#   lost      2 hosts x 2 ranks: killing host 2's ranks ends the job with an error naming the host;
#             killing the whole host (its daemon too) ends it naming the host or the lost daemon
#   stopped   2 hosts x 2 ranks: every process of host 2 stopped (SIGSTOP: its kernel still
#             answers keepalives, so mpirun never learns of it) ends the job within 60 s: the
#             collectives' timeout names host 2's ranks, and when mpirun still waits on the
#             stopped daemon after the abort, the aborting rank's helper ends it
#   unplugged 2 hosts x 2 ranks: host 2 taken off the network (no reset reaches anyone) ends the
#             job within 60 s naming the host (mpirun's keepalives; the collectives' timeout is
#             longer)
set -uo pipefail
bin=$1
case_name=$2
here=$(cd "$(dirname "$0")" && pwd)
multihost=$here/../../scripts/multihost.sh
if [ "$(id -u)" != 0 ]; then
  echo "skipped: multi-host runs need root (network namespaces)"
  exit 77
fi
for tool in ip unshare mpirun; do
  command -v $tool >/dev/null || { echo "skipped: $tool is missing"; exit 77; }
done
dir=$(mktemp -d)
cleanup() {
  bash "$multihost" down "$dir" >/dev/null 2>&1
  rm -rf "$dir"
}
trap cleanup EXIT
export MESHTENSOR_TIMEOUT=60

fail() {
  echo "FAILED: $*"
  exit 1
}
field() { sed -n "s/.*$1 \([0-9a-f]*\).*/\1/p" | head -1; }
same() {
  [ -n "$2" ] && [ "$1" = "$2" ] || fail "$3: '$2', expected '$1'"
  echo "ok: $3: $2"
}
hosts() {
  bash "$multihost" up "$1" "$dir" >"$dir/up.log" 2>&1 || {
    cat "$dir/up.log"
    echo "skipped: cannot create network namespaces here"
    exit 77
  }
}
mpi() {  # mpi SLOTS ARGS...: meshtensor on every host; output in $dir/out
  local slots=$1
  shift
  timeout 240 bash "$multihost" run "$dir" "$slots" -- "$bin" "$@" >"$dir/out" 2>&1
}

# lose_host_2 ACTION ARGS...: a long training job on 2 hosts x 2 ranks; once it runs,
# `multihost.sh ACTION ARGS...` takes host 2 away. The job must end non-zero within 60 s; sets
# status and took (seconds).
lose_host_2() {
  rm -f "$dir/out" "$dir/status"
  (mpi 2 train --model gpt:layers=1,heads=2,dim=16,context=16 --batch 4 --steps 1000000 \
     --backend mpi --mesh 2x2 --names dp,fsdp; echo $? >"$dir/status") &
  for _ in $(seq 1 60); do
    grep -q "step" "$dir/out" 2>/dev/null && break
    sleep 1
  done
  grep -q "step" "$dir/out" || fail "the job did not start"
  local start
  start=$(date +%s)
  bash "$multihost" "$@"
  wait
  took=$(($(date +%s) - start))
  status=$(cat "$dir/status")
  [ "$status" != 0 ] || fail "the job exited 0 after losing host 2"
  [ "$took" -le 60 ] || fail "the job took ${took}s to end"
}

case $case_name in
detect)
  hosts 3
  check=(check --backend mpi --seed 5 --shape 23x9)
  mpi 4 "${check[@]}" --mode exact --mesh 4x3 --from P,P --to R,R || { cat "$dir/out"; fail "check"; }
  grep -q "topology: 3 hosts (4,4,4 ranks)" "$dir/out" || { cat "$dir/out"; fail "topology not detected"; }
  echo "ok: detected $(grep topology: "$dir/out")"
  got=$(field OK <"$dir/out")
  same "$("$bin" check --seed 5 --shape 23x9 --mode exact --mesh 4x3 --from P,P --to R,R | field OK)" "$got" "exact P,P -> R,R on 4x3"
  same "$("$bin" check --seed 5 --shape 23x9 --mode exact --mesh 4x3 --from P,P --to R,R --ranks-per-host 4 | field OK)" "$got" "the same on threads with 3 simulated hosts"
  mpi 4 "${check[@]}" --mode exact --mesh 2x2x3 --from P,S0,P --to R,S1,R || { cat "$dir/out"; fail "check 2x2x3"; }
  same "$("$bin" check --seed 5 --shape 23x9 --mode exact --mesh 2x2x3 --from P,S0,P --to R,S1,R | field OK)" "$(field OK <"$dir/out")" "exact P,S0,P -> R,S1,R on 2x2x3"
  # Large enough for two levels on the detected hosts: the mpi backend's level groups.
  big=(check --backend mpi --seed 5 --shape 512x256 --mesh 4x3)
  for mode in exact ordered; do
    mpi 4 "${big[@]}" --mode $mode --from P,P --to S0,S0 || { cat "$dir/out"; fail "check $mode 512x256"; }
    grep -q "1 in two levels" "$dir/out" || { cat "$dir/out"; fail "no two-level step on mpi"; }
    echo "ok: $mode P,P -> S0,S0 of 512x256 on mpi in two levels: $(grep -m1 "^OK" "$dir/out")"
  done
  same "$("$bin" check --seed 5 --shape 512x256 --mesh 4x3 --mode exact --from P,P --to S0,S0 | field OK)" \
    "$(mpi 4 "${big[@]}" --mode exact --from P,P --to S0,S0 && field OK <"$dir/out")" "exact two-level reduce-scatter on mpi"
  mpi 4 "${check[@]}" --mode ordered --mesh 4x3 --from S0,S1 --to S1,S0 || { cat "$dir/out"; fail "ordered all_to_all"; }
  echo "ok: ordered S0,S1 -> S1,S0: $(grep -m1 "^OK" "$dir/out")"
  ;;
train)
  hosts 2
  run=(train --mode exact --model gpt:layers=1,heads=2,dim=16,context=16 --batch 8 --steps 2 --seed 3)
  for layout in "4 fsdp" "2x2 dp,fsdp" "2x2 fsdp,tp"; do
    read -r shape names <<<"$layout"
    mpi 2 "${run[@]}" --backend mpi --mesh "$shape" --names "$names" || { tail -20 "$dir/out"; fail "train $layout"; }
    same "$("$bin" "${run[@]}" --mesh "$shape" --names "$names" | field "weights digest")" \
      "$(field "weights digest" <"$dir/out")" "exact training on $layout across 2 hosts"
  done
  ;;
jagged)
  hosts 3
  mpi 4 train --mode ordered --model gpt:layers=1,heads=2,dim=16,context=16 --batch 12 --steps 2 \
    --backend mpi --mesh 4x3 --names dp,fsdp --trace "$dir/trace.json" || { tail -20 "$dir/out"; fail "train 4x3"; }
  grep -q "replicas identical on 12 ranks" "$dir/out" || { tail -20 "$dir/out"; fail "replicas differ"; }
  # Each host holds all three shards among its replicas: the parameters gather on the host.
  grep -q '"unshard \[1,0\] on this host"' "$dir/trace.json" || fail "no parameter gather on the host"
  echo "ok: (ddp=4, fsdp=3) on 3 hosts of 4: $(grep -o 'weights digest.*' "$dir/out")"
  mpi 4 check --backend mpi --mode ordered --mesh 4x3 --from P,P --to R,R --shape 64x33 || { cat "$dir/out"; fail "check"; }
  echo "ok: ordered P,P -> R,R: $(grep -m1 "^OK" "$dir/out")"
  # Groups of 12 on 3 hosts of 8 (8 + 4, 4 + 8): the jagged two-level form on mpi's own groups
  # in exact mode; ordered sums stay flat (the groups split differently), replicas identical.
  jag=(check --seed 5 --shape 512x512 --mesh 2x12 --from R,P --to R,S0)
  mpi 8 "${jag[@]}" --backend mpi --mode exact || { cat "$dir/out"; fail "check 2x12"; }
  grep -q "1 in two levels" "$dir/out" || { cat "$dir/out"; fail "exact 2x12 ran flat"; }
  same "$("$bin" "${jag[@]}" --mode exact | field OK)" "$(field OK <"$dir/out")" "exact jagged R,P -> R,S0 on 2x12"
  mpi 8 "${jag[@]}" --backend mpi --mode ordered || { cat "$dir/out"; fail "ordered check 2x12"; }
  echo "ok: ordered jagged R,P -> R,S0: $(grep -m1 "^OK" "$dir/out")"
  ;;
lost)
  hosts 2
  address=$(sed -n 2p "$dir/hosts" | cut -d' ' -f1)
  # The ranks of host 2 die (kill -9), then, in a second job, the whole host (its orted too).
  for what in meshtensor ""; do
    lose_host_2 kill "$dir" 2 $what
    if [ -n "$what" ]; then
      grep -q "$address" "$dir/out" || { tail -c 3000 "$dir/out"; fail "no message names host 2 ($address)"; }
      # Ranks 2 and 3 ran on host 2: the report names one of them and the host.
      grep -Eq "process rank [23] with PID [0-9]+ on node $address" "$dir/out" ||
        { tail -c 3000 "$dir/out"; fail "no message names a rank of host 2"; }
      echo "ok: host 2's ranks killed: exit $status after ${took}s; $(grep -Eo "process rank [23] with PID [0-9]+ on node [0-9.]+ exited on signal [0-9]+" "$dir/out" | head -1)"
    else
      # A lost daemon: OpenMPI names its host, or (when the kill meets the daemon's own
      # bookkeeping) reports the daemon as failed without the address.
      grep -Eq "$address|unable to reliably start one or more daemons|lost communication with a remote daemon" "$dir/out" ||
        { tail -c 3000 "$dir/out"; fail "no message names host 2 ($address) or its lost daemon"; }
      echo "ok: host 2 lost: exit $status after ${took}s; $(grep -Eo "(Peer host|on node):? *$address|unable to reliably start one or more daemons|lost communication with a remote daemon" "$dir/out" | head -1 | tr -s ' ')"
    fi
  done
  ;;
stopped)
  hosts 2
  MESHTENSOR_TIMEOUT=15 lose_host_2 stop "$dir" 2
  # Whichever group's collective times out first names host 2's ranks in it: [2,3], [2] or [3].
  grep -Eq "rank\(s\) \[(2,3|2|3)\] did not answer" "$dir/out" ||
    { tail -c 3000 "$dir/out"; fail "no message names host 2's ranks"; }
  echo "ok: host 2 stopped: exit $status after ${took}s; $(grep -m1 -o "meshtensor: error:.*" "$dir/out" | head -c 200)"
  ;;
unplugged)
  hosts 2
  address=$(sed -n 2p "$dir/hosts" | cut -d' ' -f1)
  lose_host_2 unplug "$dir" 2
  grep -q "$address" "$dir/out" || { tail -c 3000 "$dir/out"; fail "no message names host 2 ($address)"; }
  echo "ok: host 2 unplugged: exit $status after ${took}s; $(grep -m1 -o ".*$address.*" "$dir/out" | tr -s ' ' | head -c 200)"
  ;;
*)
  echo "unknown case $case_name"
  exit 2
  ;;
esac
