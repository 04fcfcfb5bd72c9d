#!/usr/bin/env bash
# Malformed and extreme command lines against `meshtensor`: each must end within the time limit
# (CPU time, two cores' worth, so that a busy machine does not fail a case that works; a case
# that waits without computing is ended at six times the limit of wall time), below the memory
# limit, with exit status 0 (it ran), 1 (a check mismatch: never expected here)
# or 2 (an error in the documented form `meshtensor: error: ...`); never a crash, a hang, an
# internal error (3) or the argument parser's own statuses.
# Usage: extreme_inputs.sh <meshtensor binary> [seconds per case] [MiB per case]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
limit_s=${2:-10}
cpu_s=$((2 * limit_s))
wall_s=$((6 * limit_s))
limit_mib=${3:-2048}
time_bin=$(command -v time || true)
[ -x /usr/bin/time ] && time_bin=/usr/bin/time

m8=2x2x2x2x2x2x2x2
m16=2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2
s8=S0,S1,S2,S3,S4,S5,S6,S7
r8=S7,S6,S5,S4,S3,S2,S1,S0
s16=S0,S1,S2,S3,S4,S5,S6,S7,S8,S9,S10,S11,S12,S13,S14,S15
r16=S15,S14,S13,S12,S11,S10,S9,S8,S7,S6,S5,S4,S3,S2,S1,S0
cases=(
  "plann"
  "bench"
  "bench collectve"
  "plan"
  "plan --mesh"
  "plan --mesh 2 --from S0 --to R"
  "plan --mesh 2 --from S0 --to R --shape 4 --bogus"
  "plan --mesh 2 --from S0 --to R --shape 4 --json="
  "plan --mesh 2 --from S0 --to R --shape 4 --json=1"
  "plan --mesh 0 --from S0 --to R --shape 4"
  "plan --mesh -2 --from S0 --to R --shape 4"
  "plan --mesh 2x --from S0,R --to R,R --shape 4"
  "plan --mesh 99999999999999999999 --from S0 --to R --shape 4"
  "plan --mesh 1048576x1048576 --from S0,S1 --to R,R --shape 4x4"
  "plan --mesh 2 --from S99999999999 --to R --shape 4"
  "plan --mesh 2 --from S0@5 --to R --shape 4"
  "plan --mesh 2 --from P(bogus) --to R --shape 4"
  "plan --mesh 2 --from S0 --to R --shape 281474976710657"
  "plan --mesh 2 --from S0 --to R --shape 99999999999999999999"
  "plan --mesh 2 --from S0 --to R --shape 16777216x16777216x16777216"
  "plan --mesh 2 --from S0 --to R --shape 4 --dtype f128"
  "plan --mesh 128x128 --from S0,S1 --to S1,S0 --shape 1024x1024"
  "plan --mesh 128x128 --from S0,S1 --to S1,S0 --shape 1024x1024 --no-merge --json"
  "plan --mesh 4096 --from S0 --to S0 --shape 8"
  "plan --mesh 64x64 --from P,P --to S0,S1 --shape 1000x1000"
  "plan --mesh $m8 --from $s8 --to $r8 --shape 2x2x2x2x2x2x2x2"
  "plan --mesh $m8 --from $s8 --to $r8 --shape 2x2x2x2x2x2x2x2 --no-merge"
  "plan --mesh $m16 --from $s16 --to $r16 --shape 2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2"
  "plan --mesh $m16 --from $s16 --to $r16 --shape 2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2 --no-merge"
  "check --mesh 2 --from S0 --to R --shape 4 --seed -1"
  "check --mesh 2 --from S0 --to R --shape 4 --seed 18446744073709551616"
  "check --mesh 2 --from S0 --to R --shape 4 --seed 1e3"
  "check --mesh 2 --from S0 --to R --shape 4 --seed= "
  "check --mesh 2 --from S0 --to R --shape 4 --mode fast"
  "check --mesh 2 --from S0 --to R --shape 4 --backend gpu"
  "check --mesh 2 --from S0 --to R --shape 4 --timeout 0"
  "check --mesh 2 --from S0 --to R --shape 4 --timeout -5"
  "check --mesh 2 --from S0 --to R --shape 4 --timeout nan"
  "check --mesh 2 --from S0 --to R --shape 4 --timeout 1e300"
  "check --mesh 2 --from S0 --to R --shape 16777216x16777216"
  "check --mesh 4 --from S0 --to R --shape 32768x32768"
  "check --mesh 1024 --from S0 --to R --shape 8"
  "check --mesh 4096 --from S0 --to R --shape 8"
  "check --mesh 8192 --from S0 --to R --shape 8"
  "check --mesh 64x64 --from S0,S1 --to S1,S0 --shape 64x64"
  "check --mesh 64x64 --from P,P --to R,R --shape 16 --mode exact"
  "check --mesh 256x256 --from P,P --to R,R --shape 16 --mode exact"
  "check --mesh 2x2x2x2x2x2x2x2x2x2x2x2 --from P,P,P,P,P,P,P,P,P,P,P,P --to R,R,R,R,R,R,R,R,R,R,R,R --shape 4"
  "check --mesh 2 --from P(max) --to R --shape 0x5"
  "bench collective --count 0"
  "bench collective --count -1"
  "bench collective --count 17179869184"
  "bench collective --count 99999999999999999999"
  "bench collective --iterations="
  "bench collective --iterations -3 --count 8"
  "bench collective --ranks 0 --count 8"
  "bench collective --ranks 65 --count 8"
  "bench collective --ranks 64 --count 65536 --iterations 2"
  "bench collective --op all_reduce,,all_gather --count 8"
  "bench collective --op bogus --count 8"
  "bench collective --mode ordered,bogus --count 8"
  "bench collective --json= --count 8"
  "bench redistribute --mesh 1024x1024 --from P,P --to R,R"
  "bench redistribute --mesh 4 --from P --to R --shape 4 --iterations 0"
  "bench redistribute --mesh 4 --from P --to R --shape 1048576x1048576"
  "train --model mlp:65536,65536 --steps 1"
  "train --model mlp:1048576,1048576,1048576 --steps 1"
  "train --micro-batches 2097152 --steps 1"
  "train --micro-batches 257 --steps 1"
  "train --log= --steps 1"
  "train --plot= --steps 1"
  "train --trace= --steps 1"
  "train --save= --steps 1"
  "train --resume= --steps 1"
  "train --mesh= --steps 1"
  "train --link= --steps 1"
  "train --strategy= --steps 1"
  "train --data /proc --steps 1"
  "train --data /dev/null --steps 1"
  "bench train --layouts 2x2097152"
  "bench train --model mlp:65536,65536"
  "bench fsdp --model mlp:65536,65536"
  "bench checkpoint --mib 40000"
  "bench checkpoint --mib 1048576"
  "bench checkpoint --mib 8 --dir /dev/null"
  "bench checkpoint --mib 8 --dir /etc/passwd"
  "checkpoint inspect /dev/null"
  "checkpoint verify /proc/self"
)
failures=0
for args in "${cases[@]}"; do
  start=$(date +%s%N)
  read -r -a argv <<<"$args"
  measure=()
  [ -n "$time_bin" ] && measure=("$time_bin" -f "%M" -o /tmp/extreme_inputs_rss.$$)
  (
    ulimit -t "$cpu_s"
    exec timeout -s KILL "$wall_s" "${measure[@]}" "$bin" "${argv[@]}" \
      >/tmp/extreme_inputs_out.$$ 2>/tmp/extreme_inputs_err.$$
  )
  status=$?
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  rss_mib=0
  [ -n "$time_bin" ] && [ -s /tmp/extreme_inputs_rss.$$ ] &&
    rss_mib=$(( $(tail -1 /tmp/extreme_inputs_rss.$$ | tr -dc 0-9) / 1024 ))
  verdict=ok
  if [ $status -eq 137 ] || [ $status -eq 124 ] || [ $status -eq 152 ]; then
    verdict="killed: past ${cpu_s} s of CPU time or ${wall_s} s of wall time"
  elif [ $status -ne 0 ] && [ $status -ne 2 ]; then
    verdict="exit status $status"
  elif [ $status -eq 2 ] && ! head -1 /tmp/extreme_inputs_err.$$ | grep -q '^meshtensor: error: '; then
    verdict="exit 2 without 'meshtensor: error: ...'"
  elif [ "$rss_mib" -gt "$limit_mib" ]; then
    verdict="grew to $rss_mib MiB"
  fi
  printf '%-9s %5d ms %6d MiB  exit %d  meshtensor %s\n' "$([ "$verdict" = ok ] && echo ok || echo FAIL)" \
    "$elapsed_ms" "$rss_mib" "$status" "$args"
  if [ "$verdict" != ok ]; then
    failures=$((failures + 1))
    echo "    $verdict: $(head -c 300 /tmp/extreme_inputs_err.$$)"
  fi
done
rm -f /tmp/extreme_inputs_out.$$ /tmp/extreme_inputs_err.$$ /tmp/extreme_inputs_rss.$$
echo "extreme inputs: ${#cases[@]} cases, $failures failed"
[ $failures -eq 0 ]
