#!/usr/bin/env bash
# Measures this machine into a cluster file for the timed plan (fsdp_app --plan --cluster FILE;
# docs/performance.md, "Timed plan"). Not a test: a benchmark, run on an otherwise idle node.
#
#   bash jobs/calibrate-cluster.sh [--out FILE] [--build DIR] [--np "2 3 4 8"] [--name NAME]
#
# What it measures (one node; the inter-node link cannot be measured on one node: it is written
# as the intra link of the largest group, marked so in the file):
#   gemm_TFLOPs    apps/sgemm_peak, one thread, 512^3, the median of 20 (a model's GEMM sizes; the
#                  best of 1024^3 was 15% above what they reach). The CPU has one f32 rate: tf32
#                  and bf16 are written the same. One core is the device: a model's GEMMs (128-2048
#                  rows) gain little from a second OpenBLAS thread (measured: np 1 with 2 threads
#                  0.74 s a step, 2 ranks of one thread each 0.63 s), so the node is `cores`
#                  devices and ranks beyond them share one (ranks_per_device).
#   gemm_half_dim  from the median rate at 64^3: r64 = r512 x 64 / (64 + h), so h = 64 (r512/r64 - 1)
#   memory_GBps    apps/sgemm_peak --memory, one thread: memcpy's read + write traffic
#   dropout_Gelem_per_s  apps/sgemm_peak --dropout, one thread: the CPU kernels' dropout_forward
#                  (a Philox block per element: about 20 ns each, 40x its memory traffic's time)
#   backends       fsdp_bench at each np (mpi, ucx; all_gather, reduce_scatter, all_reduce, 1 KiB
#                  to 64 MiB): per np, latency = the median over the three ops of the 1 KiB call's
#                  time over its ring steps (n-1, or 2(n-1) for all_reduce), busbw = the median
#                  busbw of the calls of 8 MiB and more. Written as intra_by_ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build-calibration/cluster.yaml build=build nps="2 3 4 8" name="$(hostname -s)"
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "calibrate-cluster: unknown argument $1 (try --help)" >&2; exit 1 ;;
  esac
done
for app in sgemm_peak fsdp_bench; do
  [ -x "$build/apps/$app" ] || { echo "calibrate-cluster: $build/apps/$app not built (bash jobs/build.sh)" >&2; exit 1; }
done
cores=$(getconf _NPROCESSORS_ONLN)
work=$(dirname "$out")/calibration-raw
mkdir -p "$work"
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$build/apps/sgemm_peak" --threads 1 --size 512 --reps 20 | tee "$work/sgemm.txt"
"$build/apps/sgemm_peak" --threads 1 --size 64 --reps 200 | tee "$work/sgemm64.txt"
"$build/apps/sgemm_peak" --memory --threads 1 --reps 5 | tee "$work/memory.txt"
OMP_NUM_THREADS=1 "$build/apps/sgemm_peak" --dropout --reps 5 | tee "$work/dropout.txt"
for np in $nps; do
  threads=$((cores / np)); [ "$threads" -ge 1 ] || threads=1
  echo "fsdp_bench at np $np"
  OPENBLAS_NUM_THREADS=$threads timeout 600 mpirun -np "$np" "$build/apps/fsdp_bench" --backend mpi,ucx \
    -b 1K -e 64M -f 4 -n 10 -w 3 --csv "$work/bench_np$np.csv" >"$work/bench_np$np.txt"
done
/usr/bin/python3 - "$work" "$out" "$name" "$cores" "$nps" <<'PY'
import csv, re, statistics, sys, datetime
work, out, name, cores, nps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), [int(n) for n in sys.argv[5].split()]
gflops = float(re.search(r"median ([\d.]+) GFLOP/s", open(f"{work}/sgemm.txt").read()).group(1))
r64 = float(re.search(r"median ([\d.]+) GFLOP/s", open(f"{work}/sgemm64.txt").read()).group(1))
half_dim = max(0.0, 64 * (gflops / r64 - 1))
traffic = float(re.search(r"memory traffic ([\d.]+) GB/s", open(f"{work}/memory.txt").read()).group(1))
dropout = float(re.search(r"best ([\d.]+) G elements/s", open(f"{work}/dropout.txt").read()).group(1))
links = {}
for np in nps:
    rows = list(csv.DictReader(open(f"{work}/bench_np{np}.csv")))
    for backend in ("mpi", "ucx"):
        mine = [r for r in rows if r["backend"] == backend]
        lat = []
        for op in ("all_gather", "reduce_scatter", "all_reduce"):
            small = [r for r in mine if r["op"] == op and int(r["size_bytes"]) == 1024]
            if small:
                steps = 2 * (np - 1) if op == "all_reduce" else np - 1
                lat.append(float(small[0]["time_us"]) / steps)
        big = [float(r["busbw_GBps"]) for r in mine if int(r["size_bytes"]) >= 8 << 20]
        if lat and big:
            links.setdefault(backend, {})[np] = (statistics.median(big), statistics.median(lat))
tf = gflops / 1000
lines = [f"# Measured by jobs/calibrate-cluster.sh on {datetime.date.today()} ({cores} cores).",
         f"name: {name}", "device: cpu", f"devices_per_node: {cores}",
         "host_memory_GiB: %d" % (int(open('/proc/meminfo').readline().split()[1]) // (1 << 20)),
         f"gemm_TFLOPs: {{f32: {tf:.4f}, tf32: {tf:.4f}, bf16: {tf:.4f}}}", "gemm_efficiency: 1", f"gemm_half_dim: {half_dim:.1f}", f"dropout_Gelem_per_s: {dropout:.4f}",
         f"memory_GBps: {traffic:.2f}", f"host_link_GBps: {traffic:.2f}", "kernel_overhead_us: 2", "backends:"]
for backend, by_np in links.items():
    largest = by_np[max(by_np)]
    lines.append(f"  {backend}:")
    lines.append(f"    intra: {{busbw_GBps: {largest[0]:.3f}, latency_us: {largest[1]:.2f}}}")
    lines.append(f"    inter: {{busbw_GBps: {largest[0]:.3f}, latency_us: {largest[1]:.2f}}}  # not measured: one node")
    lines.append("    intra_by_ranks: {" + ", ".join(f"{n}: {{busbw_GBps: {b:.3f}, latency_us: {l:.2f}}}" for n, (b, l) in sorted(by_np.items())) + "}")
    lines.append("    overlaps_compute: false  # MPI/UCX progress only while the rank polls")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"calibrate-cluster: wrote {out}")
PY
