#!/usr/bin/env bash
# One setting's effect on the bench transformer's speed, A/B in interleaved pairs (not a test,
# not in CI): each pair reads apps/sgemm_peak at the ranks' thread count, then runs fsdp_app
# without and with the setting (every other pair the other way round, so a drift of the shared
# machine's speed weighs on both sides alike). A run's rate is the median tokens/s of steps 2..N;
# % of peak divides the model FLOPs (164.36 MFLOP a token, jobs/bench_flops.py) by the pair's peak.
# A global batch of 8 split over the ranks, one OpenBLAS thread per rank, --bind-to none (as
# jobs/bench-peer.sh and bench-cpu-speed.sh --strong).
#
#   bash jobs/bench-ab.sh KEY=VALUE [--np N] [--pairs P] [--steps S] [--strategy S] [--build DIR]
#   e.g. bash jobs/bench-ab.sh fsdp.node_shared_params=true --np 2     (defaults: np 2, 5 pairs,
#        8 steps, FULL_SHARD, build; ~7 minutes on 2 cores)
#
# Prints one line per pair (both rates, B/A, both % of peak) and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] && [[ $1 == *=* ]] || { sed -n '10,12p' "$0" >&2; exit 2; }
setting=$1
shift
np=2 pairs=5 steps=8 strategy=FULL_SHARD build=build
while [ $# -gt 0 ]; do
  case $1 in
    --np) np=${2:-}; shift 2 ;;
    --pairs) pairs=${2:-}; shift 2 ;;
    --steps) steps=${2:-}; shift 2 ;;
    --strategy) strategy=${2:-}; shift 2 ;;
    --build) build=${2:-}; shift 2 ;;
    *) echo "bench-ab: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in "$np" "$pairs" "$steps"; do
  case $v in ''|*[!0-9]*|0) echo "bench-ab: --np, --pairs and --steps need positive integers" >&2; exit 2 ;; esac
done
[ "$steps" -ge 3 ] || { echo "bench-ab: --steps needs at least 3 (step 1 is not timed)" >&2; exit 2; }
for exe in fsdp_app sgemm_peak; do
  [ -x "$build/apps/$exe" ] || { echo "bench-ab: $build/apps/$exe not built (ninja -C $build)" >&2; exit 1; }
done
# The peak at as many threads as the ranks can run at once (before OMP_NUM_THREADS=1, which nproc
# would obey).
cores=$(nproc)
threads=$((np < cores ? np : cores))
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

rate() {  # extra --set arguments -> median tokens/s of steps 2..N; fails when the run does
  local log
  log=$(timeout 600 mpirun -np "$np" --bind-to none "$build/apps/fsdp_app" input/transformer_bench.yaml \
    --set train.steps="$steps" --set train.global_batch_size=8 --set fsdp.sharding_strategy="$strategy" "$@" 2>&1) ||
    { echo "bench-ab: fsdp_app failed: $(tail -n 3 <<<"$log")" >&2; return 1; }
  awk '/^step [0-9]+\// && !/^step 1\// {for (i = 1; i < NF; ++i) if ($(i + 1) == "tokens/s") print $i}' <<<"$log" |
    sort -n | awk '{v[NR] = $1} END {if (NR == 0) exit 1; print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
echo "bench-ab: $setting, np $np, $strategy, global batch 8, $steps steps, $pairs pairs"
results=()
for ((i = 1; i <= pairs; ++i)); do
  peak=$("$build/apps/sgemm_peak" --threads "$threads" | awk '/median/ {print $(NF-1)}')
  if ((i % 2)); then a=$(rate); b=$(rate --set "$setting"); else b=$(rate --set "$setting"); a=$(rate); fi
  line=$(awk -v p="$peak" -v a="$a" -v b="$b" -v i="$i" 'BEGIN {
    printf "pair %d: sgemm %.1f GFLOP/s; A %.1f tok/s (%.1f%%), B %.1f tok/s (%.1f%%), B/A %.3f", i, p, a,
      a * 0.16436 / p * 100, b, b * 0.16436 / p * 100, b / a }')
  echo "$line"
  results+=("$(awk -v p="$peak" -v a="$a" -v b="$b" 'BEGIN {print b / a, a * 0.16436 / p * 100, b * 0.16436 / p * 100}')")
done
printf '%s\n' "${results[@]}" | awk '
  {r[NR] = $1; pa[NR] = $2; pb[NR] = $3}
  function med(v, n,   i, j, t) { for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (v[j] < v[i]) {t = v[i]; v[i] = v[j]; v[j] = t}
                                   return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
  END {printf "medians: B/A %.3f; A %.1f%%, B %.1f%% of the sgemm peak\n", med(r, NR), med(pa, NR), med(pb, NR)}'
