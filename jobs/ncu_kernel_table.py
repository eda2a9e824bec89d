"""Where a run's device time goes, from Nsight Compute's CSV (run-gpu-checks.sh's performance
check: `ncu --metrics gpu__time_duration.sum --csv --print-units base --print-kernel-base function
--log-file FILE`). Sums each kernel's duration by name and prints a markdown table, largest first,
with cuBLAS/cuBLASLt GEMM kernels also totalled as one line, so the next step of the performance
work reads off it. Standard library only: runs under any python3.

usage: ncu_kernel_table.py NCU.csv [--top N]
"""
import csv
import sys
from collections import defaultdict

GEMM_MARKERS = ("gemm", "xmma", "cutlass", "sm90_", "sm80_", "ampere_", "hopper_", "cublas")


def read_rows(path):
    with open(path, newline="", errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # drop ==PROF== and the app's own lines
    return list(csv.DictReader(lines))


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 20
    rows = read_rows(argv[1])
    total_ns = 0.0
    by_name = defaultdict(lambda: [0.0, 0])
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            ns = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        unit = r.get("Metric Unit", "nsecond")
        ns *= {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1.0)
        name = r.get("Kernel Name", "?")
        by_name[name][0] += ns
        by_name[name][1] += 1
        total_ns += ns
    if not by_name:
        raise SystemExit(f"{argv[1]}: no gpu__time_duration.sum rows (did ncu run?)")
    gemm_ns = sum(v[0] for k, v in by_name.items() if any(m in k.lower() for m in GEMM_MARKERS))
    gemm_n = sum(v[1] for k, v in by_name.items() if any(m in k.lower() for m in GEMM_MARKERS))
    print(f"{sum(v[1] for v in by_name.values())} kernels, {total_ns / 1e6:.1f} ms of device time; "
          f"GEMM kernels (cuBLAS) {gemm_ns / 1e6:.1f} ms = {100 * gemm_ns / total_ns:.1f}% over {gemm_n} launches")
    print()
    print("| kernel | launches | total ms | share | mean us |")
    print("|---|---:|---:|---:|---:|")
    for name, (ns, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name[:80]} | {n} | {ns / 1e6:.2f} | {100 * ns / total_ns:.1f}% | {ns / n / 1e3:.1f} |")


if __name__ == "__main__":
    main(sys.argv)
