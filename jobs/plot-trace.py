#!/usr/bin/python3
"""jobs/plot-trace.py TRACE.json OUT.png: the step breakdown of an output.trace file, per rank.

One stacked bar per rank: seconds per step (the mean over the traced steps) in compute, exposed
communication, the optimizer, and the rest of the step ("other": data loading, the loss
all_reduce, issuing collectives), from the breakdown each rank's "step" spans carry (fsdp/trace.h
defines the fields). The title gives the mean overlap (1 - exposed_comm / comm). Needs gnuplot
(jobs/install-deps.sh installs gnuplot-nox); run with Debian's /usr/bin/python3.
Exit 0 ok, 1 bad trace file, 2 bad arguments.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def fail(code, message):
    print("plot-trace: " + message, file=sys.stderr)
    sys.exit(code)


def breakdown(path):
    """{rank: [steps, compute, exposed, optimizer, other, comm]} summed over the traced steps."""
    try:
        with open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(1, f"{path}: not a trace file ({e})")
    ranks = {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("name") != "step":
            continue
        args = e.get("args", {})
        if "compute_s" not in args:
            continue
        step_s = e["dur"] * 1e-6
        parts = [args["compute_s"], args["exposed_comm_s"], args["optimizer_s"]]
        row = ranks.setdefault(e["pid"], [0, 0.0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        for i, v in enumerate(parts):
            row[1 + i] += v
        row[4] += max(0.0, step_s - sum(parts))
        row[5] += args["comm_s"]
    if not ranks:
        fail(1, f"{path}: no step spans with a breakdown (was the run traced with output.trace?)")
    return ranks


def main():
    if len(sys.argv) != 3:
        fail(2, "usage: jobs/plot-trace.py TRACE.json OUT.png")
    path, out = sys.argv[1], sys.argv[2]
    if shutil.which("gnuplot") is None:
        fail(1, "gnuplot not found (bash jobs/install-deps.sh)")
    ranks = breakdown(path)
    exposed = sum(r[2] for r in ranks.values())
    comm = sum(r[5] for r in ranks.values())
    overlap = f"overlap {1 - exposed / comm:.2f}" if comm > 0 else "no collectives"
    steps = max(r[0] for r in ranks.values())
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "breakdown.dat")
        with open(data, "w") as f:
            f.write("# rank compute exposed_comm optimizer other\n")
            for rank in sorted(ranks):
                n, *parts = ranks[rank]
                f.write(f"{rank} " + " ".join(f"{v / n:.9g}" for v in parts[:4]) + "\n")
        script = f"""
set terminal pngcairo size 900,520 noenhanced
set output '{out}'
set title 'step breakdown per rank: {os.path.basename(path)}, mean of {steps} traced step(s), {overlap}'
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.7
set ylabel 'seconds per step'
set xlabel 'rank'
set yrange [0:*]
set key outside right top
set grid ytics
plot '{data}' using 2:xtic(1) title 'compute' lc rgb '#4c72b0', \\
     '' using 3 title 'exposed comm' lc rgb '#dd8452', \\
     '' using 4 title 'optimizer' lc rgb '#55a868', \\
     '' using 5 title 'other' lc rgb '#8c8c8c'
"""
        done = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
        if done.returncode != 0:
            fail(1, "gnuplot failed: " + done.stderr.strip())
    print(f"plot-trace: {out} ({len(ranks)} ranks, {steps} steps)")


if __name__ == "__main__":
    main()
