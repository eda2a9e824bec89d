#!/usr/bin/env python3
"""jobs/backend_report.py OUT INPUT NTASKS "OVERRIDES": the markdown report of
jobs/compare-backends.sbatch from OUT/bench.csv (fsdp_bench --csv) and OUT/train_<backend>_<strategy>.jsonl
(fsdp_app metrics). Writes OUT/report.md, OUT/step_time.png and OUT/loss.png (gnuplot);
OUT/busbw.png is drawn by jobs/plot-bench.sh. Standard library only."""
import csv
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def load_bench(path):
    rows = list(csv.DictReader(open(path)))
    table = {}  # op -> size -> backend -> busbw
    for r in rows:
        table.setdefault(r["op"], {}).setdefault(int(r["size_bytes"]), {})[r["backend"]] = float(r["busbw_GBps"])
    wrong = sum(int(r["wrong"]) for r in rows)
    return table, wrong


def load_runs(out):
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "train_*.jsonl"))):
        backend, strategy = os.path.basename(path)[len("train_"):-len(".jsonl")].split("_", 1)
        steps = [json.loads(l) for l in open(path) if '"loss"' in l]
        if steps:
            runs[(backend, strategy)] = steps
    return runs


def size_str(n):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    out, input_file, ntasks, overrides = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else ""
    bench, wrong = load_bench(os.path.join(out, "bench.csv"))
    runs = load_runs(out)
    backends = sorted({b for (b, _) in runs}, key=lambda b: (b != "mpi", b))
    strategies = []
    for (_, s) in runs:
        if s not in strategies:
            strategies.append(s)
    md = [f"# Backend comparison, {ntasks} ranks",
          "",
          f"{time.strftime('%Y-%m-%d %H:%M')} on {platform.node()} ({os.cpu_count()} cores); "
          f"input `{input_file}` {('`' + overrides + '`') if overrides else ''}",
          "",
          "## Collectives (fsdp_bench, f32, bus bandwidth GB/s)",
          "",
          "busbw = algbw x (n-1)/n for all_gather and reduce_scatter, x 2(n-1)/n for all_reduce "
          "(nccl-tests' definitions); `mpi-raw` is the plain MPI call on the same buffers. "
          f"Elements checked wrong: {wrong}.",
          "", "![bus bandwidth](busbw.png)", ""]
    for op, sizes in bench.items():
        cols = sorted({b for s in sizes.values() for b in s}, key=lambda b: (b != "mpi-raw", b))
        md += [f"### {op}", "", "| size | " + " | ".join(cols) + " | " +
               " | ".join(f"{b}/mpi-raw" for b in cols if b != "mpi-raw") + " |",
               "|---" * (1 + 2 * len(cols) - 1) + "|"]
        for size in sorted(sizes):
            row = sizes[size]
            raw = row.get("mpi-raw", 0.0)
            md.append(f"| {size_str(size)} | " + " | ".join(f"{row.get(b, float('nan')):.3f}" for b in cols) + " | " +
                      " | ".join(f"{row.get(b, 0.0) / raw:.2f}" if raw > 0 else "-" for b in cols if b != "mpi-raw") + " |")
        md.append("")

    md += ["## Training (fsdp_app, the same steps per backend and strategy)", "",
           "Step time: median over the steps after the first (which pays for allocations).", "",
           "![step time](step_time.png) ![loss](loss.png)", "",
           "| backend | strategy | steps | median step_time_s | samples/s | final loss | max rel loss diff vs mpi | peak MiB |",
           "|---|---|---|---|---|---|---|---|"]
    median = {}
    for strategy in strategies:
        for backend in backends:
            steps = runs.get((backend, strategy))
            if not steps:
                continue
            times = [s["step_time_s"] for s in steps[1:]] or [steps[0]["step_time_s"]]
            median[(backend, strategy)] = statistics.median(times)
            ref = runs.get(("mpi", strategy))
            diff = "-"
            if ref and backend != "mpi":
                diff = f"{max(abs(a['loss'] - b['loss']) / max(abs(b['loss']), 1e-30) for a, b in zip(steps, ref)):.2e}"
            md.append(f"| {backend} | {strategy} | {len(steps)} | {median[(backend, strategy)]:.4f} | "
                      f"{statistics.median(s['samples_per_s'] for s in steps[1:] or steps):.1f} | {steps[-1]['loss']:.6f} | "
                      f"{diff} | {steps[-1]['mem_peak_bytes']['total'] / 2**20:.1f} |")
    md.append("")
    open(os.path.join(out, "report.md"), "w").write("\n".join(md) + "\n")

    # Step time: one cluster per strategy, one bar per backend.
    dat = os.path.join(out, "step_time.dat")
    with open(dat, "w") as f:
        f.write("strategy " + " ".join(backends) + "\n")
        for s in strategies:
            f.write(s + " " + " ".join(f"{median.get((b, s), 0):.6f}" for b in backends) + "\n")
    gnuplot(f"""set terminal pngcairo size 900,550 noenhanced font 'DejaVu Sans,11'
set output '{out}/step_time.png'
set title 'median step time, {ntasks} ranks'
set ylabel 'seconds'
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set key top left
set yrange [0:*]
plot for [i=2:{1 + len(backends)}] '{dat}' using i:xtic(1) title columnheader(i)
""")
    # Loss curves: one line per backend and strategy.
    plots = []
    for (backend, strategy), steps in sorted(runs.items()):
        path = os.path.join(out, f"loss_{backend}_{strategy}.dat")
        with open(path, "w") as f:
            for s in steps:
                f.write(f"{s['step']} {s['loss']}\n")
        plots.append(f"'{path}' using 1:2 with lines lw 2 title '{backend} {strategy}'")
    gnuplot(f"""set terminal pngcairo size 900,550 noenhanced font 'DejaVu Sans,11'
set output '{out}/loss.png'
set title 'training loss per backend and strategy (identical runs overlap)'
set xlabel 'step'
set ylabel 'loss'
plot {', '.join(plots)}
""")


if __name__ == "__main__":
    main()
