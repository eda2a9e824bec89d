#!/usr/bin/env bash
# FSDP step-time benchmark (not a test): the transformer of input/transformer_bench.yaml
# (d_model 512, 8 layers, 8 heads, seq 256) under FULL_SHARD and NO_SHARD at np=2 and 4, with
# backward prefetch on (BACKWARD_PRE) and off, on the MPI backend. Prints the median step time
# of the timed steps and FULL_SHARD / NO_SHARD ratios.
#   bash jobs/bench-fsdp.sh [--build DIR] [--steps N] [--nps "2 4"] [--backend mpi]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build steps=8 nps="2 4" backend=mpi
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --nps) nps=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "bench-fsdp: unknown argument $1 (try --help)" >&2; exit 1 ;;
  esac
done
bash jobs/build.sh "$build" || exit 1  # errors shown, with what to do next
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-fsdp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
warmup=2
echo "bench-fsdp: transformer d_model 512, 8 layers, seq 256, batch 8 per rank, $steps steps (first $warmup untimed), backend $backend, $(nproc --all) cores"
printf '%-4s %-12s %-14s %12s %12s\n' np strategy prefetch step_time_s tokens_per_s
for np in $nps; do
  for strategy in NO_SHARD FULL_SHARD; do
    for prefetch in BACKWARD_PRE none; do
      [ "$strategy" = NO_SHARD ] && [ "$prefetch" = none ] && continue
      m="$tmp/${np}_${strategy}_${prefetch}.jsonl"
      timeout 1200 mpirun -np "$np" --oversubscribe --bind-to none "$build/apps/fsdp_app" input/transformer_bench.yaml \
        --set train.steps=$((steps)) --set train.threads=1 --set train.eval_every=never \
        --set fsdp.sharding_strategy=$strategy --set fsdp.backward_prefetch=$prefetch \
        --set comm.backend=$backend --set output.metrics="$m" --set output.log_every=1000 >/dev/null
      /usr/bin/python3 - "$m" "$np" "$strategy" "$prefetch" $warmup <<'PY'
import json, statistics, sys
path, np_, strategy, prefetch, warmup = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
rows = [json.loads(l) for l in open(path) if '"loss"' in l]
t = statistics.median(r["step_time_s"] for r in rows if r["step"] > warmup)
tok = statistics.median(r["tokens_per_s"] for r in rows if r["step"] > warmup)
print(f"{np_:<4} {strategy:<12} {prefetch:<14} {t:>12.3f} {tok:>12.1f}")
open(path + ".t", "w").write(str(t))
PY
    done
  done
  ns=$(cat "$tmp/${np}_NO_SHARD_BACKWARD_PRE.jsonl.t")
  fs=$(cat "$tmp/${np}_FULL_SHARD_BACKWARD_PRE.jsonl.t")
  fn=$(cat "$tmp/${np}_FULL_SHARD_none.jsonl.t")
  /usr/bin/python3 -c "print(f'np=$np: FULL_SHARD/NO_SHARD = {$fs/$ns:.3f} (prefetch on), {$fn/$ns:.3f} (prefetch off)')"
done
