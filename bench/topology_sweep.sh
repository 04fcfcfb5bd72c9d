#!/usr/bin/env bash
# The topology-aware redistribute against the topology-blind one and DTensor's one-dim plan over
# meshes, specs and sizes on simulated hosts (bench redistribute --ranks-per-host).
# Usage: bench/topology_sweep.sh <meshtensor> [LINK] [LINK_INTER]
# Prints one row per case and the smallest and largest speed-ups where the aware plan differs.
set -euo pipefail
bin=$1
link=${2:-10us,1}
inter=${3:-50us,0.05}
printf '%-6s %-4s %-14s %-10s %9s %9s %9s %7s %7s %s %s\n' mesh host from-to shape aware_ms \
  blind_ms onedim_ms blind/a onedim/a two-level plan
rows=()
for mesh_hosts in "8x5 8" "4x4 4" "2x4 4" "4x2 2"; do
  read -r mesh per_host <<<"$mesh_hosts"
  for spec in "P,P R,R" "P,P S0,S0" "P,P R,S0" "P,P S0,S1" "S0,S0 R,R" "S0,S1 R,R"; do
    read -r from to <<<"$spec"
    for shape in 64x64 512x512 1024x1024; do
      json=$("$bin" bench redistribute --mesh "$mesh" --from "$from" --to "$to" --shape "$shape" \
        --ranks-per-host "$per_host" --link "$link" --link-inter "$inter" --iterations 3 --json)
      row=$(python3 -c '
import json, sys
t = json.loads(sys.argv[1])["topology"]
print("%9.3f %9.3f %9.3f %7.2f %7.2f %d %s" % (t["aware_s"] * 1e3, t["blind_s"] * 1e3,
      t["one_dim_s"] * 1e3, t["blind_over_aware"], t["one_dim_over_aware"],
      t["aware_two_level_steps"], "differs" if t["aware_differs_from_blind"] else "same"))' "$json")
      printf '%-6s %-4s %-14s %-10s %s\n' "$mesh" "$per_host" "$from->$to" "$shape" "$row"
      # Speed-ups of plans that differ from the blind one (the others time one plan twice).
      if [[ $row == *differs ]]; then rows+=("$(echo "$row" | awk '{print $4}')"); fi
    done
  done
done
printf '%s\n' "${rows[@]}" | sort -g | sed -n '1s/^/smallest blind\/aware: /p;$s/^/largest blind\/aware: /p'
