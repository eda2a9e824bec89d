#!/usr/bin/env bash
# The core benchmark (not a test): single-rank training throughput of fsdp_app against PyTorch
# at the same thread count, and the transformer step's achieved FLOP rate as a fraction of the
# measured OpenBLAS sgemm peak.
#
#   bash jobs/bench-core.sh [--threads N] [--build DIR]     (default 2 threads, build dir build)
#
# (1) mnist_cnn, batch 64, dropout on, Adadelta: samples/s (median of 30 timed steps after 5)
# (2) transformer of input/transformer_bench.yaml (vocab 256, d_model 512, 8 layers, 8 heads,
#     d_ff 2048, seq 256), batch 8, AdamW: tokens/s (median of 8 timed steps after 2)
# (3) the transformer step's model FLOP rate: 6 * (parameters in matmuls) * tokens, plus
#     attention 12 * L * B * T^2 * C (QK^T and PV, forward 4BT^2C + backward 8BT^2C per layer,
#     counted over the full T x T even though the causal half is masked), divided by the median
#     step time; and that rate over the best sgemm GFLOP/s at N threads (apps/sgemm_peak).
# Ours: fsdp_app's per-step metrics (samples_per_s / tokens_per_s); the first steps pay for
# allocation and are dropped. Needs Debian's /usr/bin/python3 with python3-torch. ~3-5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

threads=2
build=build
while [ $# -gt 0 ]; do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "bench-core: unknown argument $1 (try --help)" >&2; exit 1 ;;
  esac
done
case $threads in ''|*[!0-9]*|0) echo "bench-core: --threads needs a positive integer" >&2; exit 1 ;; esac

python=/usr/bin/python3
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "bench-core: $python cannot import torch (install python3-torch)" >&2
  exit 1
fi
bash jobs/build.sh "$build" || exit 1  # errors shown, with what to do next

# Same thread count everywhere; OpenBLAS and OpenMP pools sized before they start.
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-core.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cnn_warmup=5 cnn_steps=30 lm_warmup=2 lm_steps=8
echo "bench-core: $threads threads, $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"

echo "-- sgemm peak"
timeout 120 "$build/apps/sgemm_peak" --threads "$threads" --size 2048 --reps 10 | tee "$tmp/sgemm.txt"

echo "-- fsdp_app mnist_cnn ($((cnn_warmup + cnn_steps)) steps)"
timeout 300 "$build/apps/fsdp_app" input/fashion_mnist.yaml \
  --set train.steps=$((cnn_warmup + cnn_steps)) --set train.threads="$threads" --set train.eval_every=never \
  --set train.shuffle=false --set train.dropout=true --set train.scheduler.kind=none \
  --set output.log_every=1000 --set output.metrics="$tmp/cnn.jsonl" | tail -1

echo "-- fsdp_app transformer ($((lm_warmup + lm_steps)) steps)"
timeout 600 "$build/apps/fsdp_app" input/transformer_bench.yaml \
  --set train.steps=$((lm_warmup + lm_steps)) --set train.threads="$threads" --set train.eval_every=never \
  --set output.log_every=1 --set output.metrics="$tmp/lm.jsonl" | tail -1

echo "-- PyTorch"
timeout 900 "$python" tests/reference/torch_bench.py --threads "$threads" \
  --cnn-steps $cnn_steps --cnn-warmup $cnn_warmup --lm-steps $lm_steps --lm-warmup $lm_warmup \
  >"$tmp/torch.json" 2>"$tmp/torch.log" || { cat "$tmp/torch.log" >&2; exit 1; }
tail -1 "$tmp/torch.log"

"$python" - "$tmp" "$threads" $cnn_warmup $lm_warmup <<'PY'
import json, statistics, sys

sys.path.insert(0, "jobs")
from bench_flops import BENCH_TRANSFORMER, transformer_matmul_params, transformer_step_flops, sgemm_peak_gflops

tmp, threads, cnn_warmup, lm_warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def ours(path, key, warmup):
    rows = [json.loads(l) for l in open(path)]
    vals = [r[key] for r in rows if "loss" in r and "step" in r and r["step"] > warmup]
    return statistics.median(vals), len(vals)

torch_r = json.load(open(f"{tmp}/torch.json"))
peak = sgemm_peak_gflops(open(f"{tmp}/sgemm.txt").read())

cnn_ours, cnn_n = ours(f"{tmp}/cnn.jsonl", "samples_per_s", cnn_warmup)
lm_ours, lm_n = ours(f"{tmp}/lm.jsonl", "tokens_per_s", lm_warmup)
cnn_torch = torch_r["mnist_cnn"]["samples_per_s"]
lm_torch = torch_r["transformer"]["tokens_per_s"]

# Transformer FLOPs per step (input/transformer_bench.yaml, batch 8): jobs/bench_flops.py.
B, T = 8, BENCH_TRANSFORMER["seq_len"]
matmul_params = transformer_matmul_params(**BENCH_TRANSFORMER)
flops_step = transformer_step_flops(B, **BENCH_TRANSFORMER)
gflops_ours = flops_step / (B * T / lm_ours) / 1e9
gflops_torch = flops_step / (B * T / lm_torch) / 1e9

print()
print(f"core benchmark, {threads} threads (sgemm peak {peak:.1f} GFLOP/s = best of 2048^3 OpenBLAS sgemm)")
print(f"{'':34} {'ours':>10} {'PyTorch':>10} {'ours/torch':>11}")
print(f"{'mnist_cnn samples/s (batch 64)':34} {cnn_ours:>10.1f} {cnn_torch:>10.1f} {cnn_ours / cnn_torch:>11.2f}")
print(f"{'transformer tokens/s (B 8, T 256)':34} {lm_ours:>10.1f} {lm_torch:>10.1f} {lm_ours / lm_torch:>11.2f}")
print(f"{'transformer step GFLOP/s':34} {gflops_ours:>10.1f} {gflops_torch:>10.1f} {gflops_ours / gflops_torch:>11.2f}")
print(f"{'  fraction of sgemm peak':34} {gflops_ours / peak:>10.1%} {gflops_torch / peak:>10.1%}")
print(f"FLOPs/step {flops_step / 1e9:.1f} G = 6 x {matmul_params / 1e6:.2f} M matmul params x {B * T} tokens"
      f" + attention 12*L*B*T^2*C (full T x T, forward+backward)")
print(f"ours: median of {cnn_n} (mnist_cnn) and {lm_n} (transformer) steps after the first {cnn_warmup}/{lm_warmup};"
      f" torch: median of {torch_r['mnist_cnn']['timed_steps']}/{torch_r['transformer']['timed_steps']} timed steps"
      f" ({torch_r['mnist_cnn']['data']} images), torch {torch_r['torch']}")
PY
