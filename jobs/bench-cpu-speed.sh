#!/usr/bin/env bash
# The bench transformer's step rate against the sgemm peak at np 1 and 2, interleaved (not a
# test, not in CI; no PyTorch needed). Each round: apps/sgemm_peak at 1 thread, fsdp_app np 1
# FULL_SHARD and NO_SHARD, sgemm_peak at 1 thread again, then the same at 2 threads and np 2.
# A run's rate is the median tokens/s of steps 2..N (the first pays for allocations); its % of
# peak divides the model FLOPs (jobs/bench_flops.py, 164.36 MFLOP a token) by the mean of the two
# peak readings around the pair. batch_size (8) is per rank: np 2 trains 16 samples a step (weak
# scaling); --strong splits a global batch of 8 over the ranks instead (4 samples a rank at np 2,
# as jobs/bench-peer.sh runs it). One OpenBLAS thread per rank, --bind-to none, as bench-peer.
#
#   bash jobs/bench-cpu-speed.sh [--rounds R] [--steps N] [--strong] [--build DIR]   (defaults 3, 8, build)
#
# Prints a markdown table, one row per round, and the medians. ~2 minutes a round on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3 steps=8 build=build batch=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=${2:-}; shift 2 ;;
    --steps) steps=${2:-}; shift 2 ;;
    --build) build=${2:-}; shift 2 ;;
    --strong) batch=(--set train.global_batch_size=8); shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "bench-cpu-speed: unknown argument $1 (try --help)" >&2; exit 1 ;;
  esac
done
for v in "$rounds" "$steps"; do
  case $v in ''|*[!0-9]*|0) echo "bench-cpu-speed: --rounds and --steps need positive integers" >&2; exit 1 ;; esac
done
[ "$steps" -ge 3 ] || { echo "bench-cpu-speed: --steps needs at least 3 (step 1 is not timed)" >&2; exit 1; }
for exe in fsdp_app sgemm_peak; do
  [ -x "$build/apps/$exe" ] || { echo "bench-cpu-speed: $build/apps/$exe not built (ninja -C $build)" >&2; exit 1; }
done

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

peak() {  # median GFLOP/s of sgemm_peak at $1 threads
  "$build/apps/sgemm_peak" --threads "$1" | awk '/median/ {print $(NF-1)}'
}
rate() {  # np strategy -> median tokens/s of steps 2..N
  timeout 600 mpirun -np "$1" --bind-to none "$build/apps/fsdp_app" input/transformer_bench.yaml \
    --set train.steps="$steps" --set fsdp.sharding_strategy="$2" "${batch[@]}" 2>&1 |
    awk '/^step [0-9]+\// && !/^step 1\// {for (i = 1; i < NF; ++i) if ($(i + 1) == "tokens/s") print $i}' |
    sort -n | awk '{v[NR] = $1} END {if (NR == 0) exit 1; print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ((r = 1; r <= rounds; ++r)); do
  p1a=$(peak 1); f1=$(rate 1 FULL_SHARD); n1=$(rate 1 NO_SHARD); p1b=$(peak 1)
  p2a=$(peak 2); f2=$(rate 2 FULL_SHARD); n2=$(rate 2 NO_SHARD); p2b=$(peak 2)
  echo "$r $p1a $p1b $f1 $n1 $p2a $p2b $f2 $n2" >>"$results"
  echo "bench-cpu-speed: round $r of $rounds done" >&2
done
echo "scaling: ${batch[*]:-weak (batch_size 8 a rank)}"
/usr/bin/python3 - "$results" <<'EOF'
import statistics, sys
sys.path.insert(0, "jobs")
import bench_flops as bf

per_token = bf.transformer_step_flops(batch=8, **bf.BENCH_TRANSFORMER) / (8 * bf.BENCH_TRANSFORMER["seq_len"])
rows = [list(map(float, line.split())) for line in open(sys.argv[1])]
print(f"model FLOPs per token: {per_token / 1e6:.2f} M")
print("| round | np 1 peak | FULL_SHARD | NO_SHARD | np 2 peak | FULL_SHARD | NO_SHARD |")
print("|---:|---:|---|---|---:|---|---|")
cols = {k: [] for k in ("f1", "n1", "f2", "n2")}
for r, p1a, p1b, f1, n1, p2a, p2b, f2, n2 in rows:
    p1, p2 = (p1a + p1b) / 2, (p2a + p2b) / 2
    pct = lambda tok, p: 100 * tok * per_token / 1e9 / p
    for k, tok, p in (("f1", f1, p1), ("n1", n1, p1), ("f2", f2, p2), ("n2", n2, p2)):
        cols[k].append(pct(tok, p))
    print(f"| {int(r)} | {p1:.1f} | {f1:,.0f} tok/s, {pct(f1, p1):.1f}% | {n1:,.0f}, {pct(n1, p1):.1f}% "
          f"| {p2:.1f} | {f2:,.0f}, {pct(f2, p2):.1f}% | {n2:,.0f}, {pct(n2, p2):.1f}% |")
med = {k: statistics.median(v) for k, v in cols.items()}
print(f"medians: np 1 FULL_SHARD {med['f1']:.1f}%, NO_SHARD {med['n1']:.1f}%; "
      f"np 2 FULL_SHARD {med['f2']:.1f}%, NO_SHARD {med['n2']:.1f}% (goal: 85% at np 1 and 2)")
EOF
