#!/usr/bin/env bash
# Topologies from the command line. Usage: topology.sh <meshtensor>
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1

# plan: seed 000's all_reduce runs in two levels on hosts of 8, and says why.
out=$("$bin" plan --mesh 8x5 --names ddp,fsdp --from P,P --to R,R --shape 1024x1024 \
  --ranks-per-host 8 --link 5us,100 --link-inter 20us,5) || fail "plan"
grep -q "crosses: network (5 hosts x 8 ranks); two levels" <<<"$out" || fail "no two levels: $out"
grep -q "chosen for the topology: .* topology-blind plan" <<<"$out" || fail "no reason: $out"
echo "ok: two levels on 5 hosts"
# The order changes: inside hosts first for a reduce-scatter.
out=$("$bin" plan --mesh 2x4 --from P,P --to S0,S1 --shape 4096x512 --ranks-per-host 4 --json)
python3 - "$out" <<'PY' || fail "reduce-scatter order"
import json, sys
plan = json.loads(sys.argv[1])
groups = [(s["group"], s["level"]) for s in plan["steps"] if s["collective"]]
assert groups == [([1], "domain"), ([0], "network")], groups
assert plan["topology"]["differs_from_blind"] is True
PY
echo "ok: reduce-scatter inside hosts first"
# One host: the very plan made without a topology.
for spec in "P,P R,R" "S0,S1 R,R" "P,P S0,S1"; do
  read -r from to <<<"$spec"
  a=$("$bin" plan --mesh 8x5 --from "$from" --to "$to" --shape 1024x512)
  b=$("$bin" plan --mesh 8x5 --from "$from" --to "$to" --shape 1024x512 --ranks-per-host 40)
  [ "$a" = "$b" ] || fail "one host changed the plan of $from -> $to"
done
echo "ok: one host gives the same plans"

# check: exact digests do not depend on the topology (two levels, jagged hosts, domains).
# Jagged groups run in two levels where that pays: ordered sums when every group splits alike
# (3 + 2 on hosts of 6), exact ones also when the groups split differently (8 + 4, 4 + 8).
out=$("$bin" plan --mesh 5x2 --from P,R --to R,R --shape 257x33 --ranks-per-host 6 --link-inter 1us,0.01)
grep -q "(2 hosts, unevenly); two levels" <<<"$out" || fail "jagged groups flat: $out"
jag=(--mesh 2x12 --from R,P --to R,S0 --shape 257x33 --ranks-per-host 8 --link-inter 1us,0.01)
out=$("$bin" plan "${jag[@]}")
grep -q "split over hosts differently" <<<"$out" || fail "ordered jagged groups not flat: $out"
out=$("$bin" plan "${jag[@]}" --mode exact)
grep -q "(2 hosts, unevenly); two levels" <<<"$out" || fail "exact jagged groups flat: $out"
out=$("$bin" check "${jag[@]}" --mode exact) || fail "exact check $out"
grep -q "1 in two levels" <<<"$out" || fail "exact check flat: $out"
echo "ok: jagged groups in two levels"
for spec in "8x5 P,P R,R" "8x5 P,P S0,S1" "4x3 P,P R,S0" "2x2x3 P,S0,P R,S1,R" "2x6 R,P R,S0" "5x2 P,R R,R"; do
  read -r mesh from to <<<"$spec"
  base=$("$bin" check --mode exact --seed 7 --shape 257x33 --mesh "$mesh" --from "$from" --to "$to" | field OK)
  [ -n "$base" ] || fail "check $spec"
  for hosts in "--ranks-per-host 4" "--ranks-per-host 8 --ranks-per-domain 4" "--ranks-per-host 7"; do
    got=$("$bin" check --mode exact --seed 7 --shape 257x33 --mesh "$mesh" --from "$from" --to "$to" \
      $hosts --link-inter 1us,0.01 2>&1 | field OK)
    [ "$got" = "$base" ] || fail "exact $spec with $hosts: '$got', expected '$base'"
  done
  # Ordered mode: replicas and the reference agree (check verifies every rank).
  "$bin" check --mode ordered --seed 7 --shape 257x33 --mesh "$mesh" --from "$from" --to "$to" \
    --ranks-per-host 4 >/dev/null || fail "ordered $spec"
done
echo "ok: exact digests equal on every topology"

# Exact training digests with hosts (FSDP lanes in two levels where cheaper).
run=(train --mode exact --model gpt:layers=1,heads=2,dim=16,context=16 --batch 8 --steps 2 --seed 3)
base=$("$bin" "${run[@]}" --mesh 2x4 --names dp,fsdp | field "weights digest")
got=$("$bin" "${run[@]}" --mesh 2x4 --names dp,fsdp --ranks-per-host 2 --link 1us,10 --link-inter 1us,0.01 | field "weights digest")
[ -n "$base" ] && [ "$got" = "$base" ] || fail "training digest '$got', expected '$base'"
got=$("$bin" "${run[@]}" --mesh 2x6 --names dp,fsdp --ranks-per-host 4 --link-inter 1us,0.01 | field "weights digest")
base=$("$bin" "${run[@]}" --mesh 2x6 --names dp,fsdp | field "weights digest")
[ -n "$base" ] && [ "$got" = "$base" ] || fail "jagged training digest '$got', expected '$base'"
echo "ok: exact training digest on 4 hosts and on jagged ones"

# HSDP in two levels on seed 000's 8x5 mesh on hosts of 8: the ordered gradients reduce-scatter
# over both dims (the lane "reduce [1,0]") and all-gather over the replicas, every replica ending
# on the same bits; exact digests stay those of one host.
hsdp=(train --model gpt:layers=1,heads=2,dim=16,context=16 --batch 40 --steps 2 --seed 3
  --mesh 8x5 --names dp,fsdp)
trace=$(mktemp)
out=$("$bin" "${hsdp[@]}" --ranks-per-host 8 --link-inter 1us,0.01 --trace "$trace")
grep -q "replicas identical on 40 ranks" <<<"$out" || fail "ordered hsdp on hosts: $out"
grep -q '"reduce \[1,0\]"' "$trace" || fail "no reduce-scatter over both dims in the trace"
# Every host holds all five shards among its replicas: the parameters gather there.
grep -q '"unshard \[1,0\] on this host"' "$trace" || fail "no parameter gather on the host"
"$bin" "${hsdp[@]}" --trace "$trace" >/dev/null
grep -q '"reduce \[1,0\]"' "$trace" && fail "two levels on one host"
grep -q 'on this host"' "$trace" && fail "a gather on the host of a one-host run"
rm -f "$trace"
base=$("$bin" "${hsdp[@]}" --mode exact | field "weights digest")
got=$("$bin" "${hsdp[@]}" --mode exact --ranks-per-host 8 --link-inter 1us,0.01 | field "weights digest")
[ -n "$base" ] && [ "$got" = "$base" ] || fail "hsdp exact digest '$got', expected '$base'"
echo "ok: hsdp gradients in two levels and parameters gathered on the host on seed 000's mesh"

# Bad values name the option and the value.
expect_error() {
  local pattern=$1
  shift
  local out
  out=$("$bin" "$@" 2>&1) && fail "accepted: $*"
  grep -q -- "$pattern" <<<"$out" || fail "'$*' said: $out"
}
expect_error "--ranks-per-host: '0' is too small" plan --mesh 4 --from P --to R --shape 4 --ranks-per-host 0
expect_error "--ranks-per-host: 'x' is not" plan --mesh 4 --from P --to R --shape 4 --ranks-per-host 2,x
expect_error "ranks per host 1,1 hold 2 ranks, fewer than the 4" plan --mesh 4 --from P --to R --shape 4 --ranks-per-host 1,1
expect_error "--link-inter 'fast': no comma" plan --mesh 4 --from P --to R --shape 4 --ranks-per-host 2 --link-inter fast
expect_error "--ranks-per-domain needs --ranks-per-host" plan --mesh 4 --from P --to R --shape 4 --ranks-per-domain 2
expect_error "mpi detects its hosts" check --mesh 2 --from P --to R --shape 4 --backend mpi --ranks-per-host 1
echo "ok: bad values named"
