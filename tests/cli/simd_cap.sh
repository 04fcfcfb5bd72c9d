#!/usr/bin/env bash
# MESHTENSOR_SIMD caps the kernels' SIMD level: every level this CPU runs trains to the same
# exact digests and bench peak names the level; an unknown level and one above the CPU's are
# named. Usage: simd_cap.sh <meshtensor>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
run=(train --mode exact --model gpt:layers=1,heads=2,dim=16,context=16 --steps 2 --batch 3
     --ranks 2 --no-sample)
best=$(MESHTENSOR_SIMD= "$bin" bench peak --seconds 0.02 --triad-mib 12 | sed -n 's/.*, kernels \([a-z0-9]*\),.*/\1/p')
[ -n "$best" ] || fail "bench peak names no kernels level"
want=$(digests "$bin" "${run[@]}")
for level in baseline avx2 avx512; do
  if [ "$level" = avx512 ] && [ "$best" != avx512 ]; then
    expect 2 "MESHTENSOR_SIMD=avx512: this CPU cannot run the avx512 kernels (its best is $best)" \
      env MESHTENSOR_SIMD=avx512 "$bin" "${run[@]}"
    continue
  fi
  [ "$level" = avx2 ] && [ "$best" = baseline ] && continue
  same "$want" "$(MESHTENSOR_SIMD=$level digests "$bin" "${run[@]}")" "exact digests at $level"
  MESHTENSOR_SIMD=$level "$bin" bench peak --seconds 0.02 --triad-mib 12 | grep -q "kernels $level," ||
    fail "bench peak under MESHTENSOR_SIMD=$level does not name it"
  echo "ok: $level: $want"
done
expect 2 "unknown MESHTENSOR_SIMD level 'avx9': expected one of baseline, avx2, avx512" \
  env MESHTENSOR_SIMD=avx9 "$bin" "${run[@]}"
echo "passed"
