"""Report of jobs/bench-peer.sh: reads OUT_DIR/runs, writes OUT_DIR/table.md, results.json and
peer.png (gnuplot); exit 1 when the losses do not agree.

usage: /usr/bin/python3 jobs/bench_peer_report.py OUT_DIR

Per run (model, np, implementation, strategy): the median step time over the steps after the
first (which pays for allocations on both sides) of all its repeats (NAME, NAME~r2, ...: see
bench-peer.sh --repeats; table.md then lists each repeat's median too), tokens/s (transformer,
llama) or samples/s (mnist_cnn) of the global batch at that median, the peak RSS of each rank (/usr/bin/time's
maximum RSS, getrusage of the rank's process), and the model FLOP rate (jobs/bench_flops.py)
over the sgemm peak at the threads the run could use (np x threads per rank, at most the CPUs).
The sgemm peak is measured just before every run (runs/NAME.sgemm, best of 5); the denominator is
the median of all of this bench's readings at that thread count. On a shared machine one reading
moves by 10-20% with the neighbours' load (76-90 GFLOP/s on one core here), which moved a row's
fraction by up to 10 points between runs of the same binary; the machine's peak is one number,
and the median of 8-16 readings spread over the whole bench estimates it far more steadily.
results.json keeps each run's own reading (sgemm_before_run_gflops); table.md gives the range.

The loss check: every run of a model trains the same global batches from the same weights, so
every run's per-step loss must equal the reference run's (PyTorch FSDP2 at the smallest np) to
the relative tolerance loss_rtol(model, step). What may differ is float rounding: the order of
the sums in the GEMMs (OpenBLAS or oneDNN kernels, blocking by thread), in the gradient
reduction over ranks (gloo's ring or tree against our reduce-scatter and all-reduce) and in
torch's fused kernels; it grows over the steps. Seen here (AMD EPYC, AVX2): at most 2e-7
(mnist_cnn, 8 steps, np 1-4), 4e-8 (transformer, 3 steps, np 1) and 2e-7 (llama, 4 steps, np
1-4; 8 steps at np 4: 1.1e-7). A wrong data order, initial
weight, rank slice or gradient average (a sum instead of a mean over the ranks) moves the loss by
1e-2 and more within two steps. Small formula errors that change one update by ~1e-3 relative
(AdamW's weight decay dropped, say) move the loss less than rounding does in a few steps: that is
tests/reference/check_reference.py's job (each step replayed from torch's state), not this one.
  transformer, llama: 1e-4 at every step (check_reference.py holds the small transformer's free
    run to TRAJECTORY_RTOL 1e-5; this one has 4x-8x longer dot products and a cross-rank
    reduction; PyTorch's llama twin runs scaled_dot_product_attention's fused CPU kernel, ours
    the scores then the softmax).
  mnist_cnn: 1e-4 up to step 10, then check_reference.CHAOTIC_RTOL (1e-2): Adadelta at lr 1 with
    near-tied max-pool windows turns a last-bit difference into a jump once a tie flips (on this
    CPU after ~13 steps; torch against itself, oneDNN against im2col, reaches 1e-3 by step 19).
The PyTorch side runs its default CPU kernels (oneDNN convolutions), as its users do.
"""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests", "reference")]
from bench_flops import (BENCH_LLAMA, BENCH_TRANSFORMER, llama_step_flops, mnist_cnn_step_flops,  # noqa: E402
                         sgemm_peak_gflops, transformer_executed_step_flops, transformer_step_flops)
from check_reference import CHAOTIC_RTOL  # noqa: E402

MNIST_TIGHT_STEPS = 10


# --param-dtype bf16 (both sides computing in bf16): a last-bit difference of a GEMM's f32 sum now
# flips a bf16 rounding (2^-8 relative) of an activation or gradient now and then, and AdamW's
# sign-like first steps carry those flips into the weights, so the trajectories part at ~1e-4 by
# step 2 (tests/reference/check_reference.py's bf16 free runs: 7e-5 to 1.4e-4 over 20 steps).
BF16_RTOL = 1e-3


def loss_rtol(model, step, param_dtype="f32"):
    """The relative loss tolerance at 1-based `step` (see the module's docstring)."""
    if param_dtype != "f32":
        return BF16_RTOL
    if model in SEQ_LEN:
        return 1e-4
    return 1e-4 if step <= MNIST_TIGHT_STEPS else CHAOTIC_RTOL


BATCH = {"transformer": 8, "llama": 8, "mnist_cnn": 64}
SEQ_LEN = {"transformer": BENCH_TRANSFORMER["seq_len"], "llama": BENCH_LLAMA["seq_len"]}  # token models
MODELS = ["transformer", "llama", "mnist_cnn"]  # the table's order


def step_flops(model, batch):
    if model == "transformer":
        return transformer_step_flops(batch, **BENCH_TRANSFORMER)
    return llama_step_flops(batch, **BENCH_LLAMA) if model == "llama" else mnist_cnn_step_flops(batch)
IMPL = {  # run name part -> (implementation, strategy)
    "ours_FULL_SHARD": ("fsdp-hpc", "FULL_SHARD"),
    "ours_NO_SHARD": ("fsdp-hpc", "NO_SHARD"),
    "ours_FULL_SHARD_shared": ("fsdp-hpc, fsdp.node_shared_params", "FULL_SHARD"),
    "torch_fsdp2": ("PyTorch FSDP2 fully_shard", "FULL_SHARD"),
    "torch_ddp": ("PyTorch DDP", "NO_SHARD"),
    "torch_fsdp1_full": ("PyTorch FSDP1", "FULL_SHARD"),
    "torch_fsdp1_no": ("PyTorch FSDP1", "NO_SHARD"),
}
ORDER = list(IMPL)


def fail(msg):
    raise SystemExit(f"bench_peer_report: {msg}")


def read_run(runs, name):
    """(losses, step times) of one run, from ours' metrics or torch_peer.py's JSON."""
    if os.path.exists(os.path.join(runs, name + ".jsonl")):
        rows = [json.loads(line) for line in open(os.path.join(runs, name + ".jsonl"))]
        rows = [r for r in rows if "step" in r and "loss" in r]
        return [r["loss"] for r in rows], [r["step_time_s"] for r in rows]
    path = os.path.join(runs, name + ".json")
    if not os.path.exists(path):
        fail(f"{path}: missing (did the run finish?)")
    j = json.load(open(path))
    return j["losses"], j["step_time_s"]


def rss_mib(runs, name, np_):
    out = []
    for rank in range(np_):
        path = os.path.join(runs, f"{name}.rss.{rank}")
        lines = open(path).read().split() if os.path.exists(path) else []
        if not lines or not lines[-1].isdigit():
            fail(f"{path}: no maximum RSS from /usr/bin/time")
        out.append(int(lines[-1]) / 1024.0)
    return out


def rel(a, b):
    return abs(a - b) / abs(b)


def main():
    if len(sys.argv) != 2:
        fail("usage: bench_peer_report.py OUT_DIR")
    out = sys.argv[1]
    runs = os.path.join(out, "runs")
    env = dict(line.split(": ", 1) for line in open(os.path.join(out, "env.txt")).read().splitlines() if ": " in line)
    pdt = env.get("param_dtype", "f32")
    threads = int(env["threads_per_rank"])
    ncpu = int(env["cpus"])

    # Repeat k > 1 of a run is NAME~rK (bench-peer.sh --repeats); a row pools its repeats.
    by_base = {}
    for f in sorted(os.listdir(runs)):
        if not (f.endswith(".jsonl") or (f.endswith(".json"))):
            continue
        name = f.rsplit(".", 1)[0]
        base, _, rep = name.partition("~r")
        by_base.setdefault(base, []).append((int(rep) if rep else 1, name))
    results = []
    for base, reps in by_base.items():
        reps.sort()
        model, np_part, rest = base.split("_np")[0], base.split("_np")[1].split("_", 1)[0], base.split("_np")[1].split("_", 1)[1]
        np_ = int(np_part)
        batch = BATCH[model]
        flops = step_flops(model, batch)
        items = batch * SEQ_LEN.get(model, 1)
        impl, strategy = IMPL[rest]
        repeats, timed, rss = [], [], []
        for _, name in reps:
            losses, times = read_run(runs, name)
            if len(times) < 2:
                fail(f"{name}: {len(times)} steps, need 2 (the first is not timed)")
            reading = sgemm_peak_gflops(open(os.path.join(runs, name + ".sgemm")).read())
            repeats.append(dict(name=name, losses=losses, step_time_s=times, median_step_s=statistics.median(times[1:]),
                                sgemm_before_run_gflops=reading))
            timed += times[1:]
            rss.append(rss_mib(runs, name, np_))
        # The median over every timed step of every repeat: one repeat's steps share its process's
        # placement and the machine's load of that minute; repeats spread over the bench do not.
        step_s = statistics.median(timed)
        results.append(dict(name=base, model=model, np=np_, key=rest, impl=impl, strategy=strategy,
                            losses=repeats[0]["losses"], repeats=repeats, median_step_s=step_s, per_s=items / step_s,
                            gflops=flops / step_s / 1e9, flops=flops, peak_threads=min(np_ * threads, ncpu),
                            rss_mib=[max(col) for col in zip(*rss)]))
    if not results:
        fail(f"{runs}: no runs")
    readings = {}  # threads -> every run's sgemm reading at that thread count
    for r in results:
        readings.setdefault(r["peak_threads"], []).extend(x["sgemm_before_run_gflops"] for x in r["repeats"])
    for r in results:
        r["peak_gflops"] = statistics.median(readings[r["peak_threads"]])
        r["frac_peak"] = r["gflops"] / r["peak_gflops"]
        for x in r["repeats"]:
            x["frac_peak"] = r["flops"] / x["median_step_s"] / 1e9 / r["peak_gflops"]
    results.sort(key=lambda r: (MODELS.index(r["model"]), r["np"], ORDER.index(r["key"])))

    bad = []
    for model in dict.fromkeys(r["model"] for r in results):
        mine = [r for r in results if r["model"] == model]
        refs = [r for r in mine if r["key"] == "torch_fsdp2"] or mine
        ref = min(refs, key=lambda r: r["np"])
        for r in mine:
            r["loss_ref"] = ref["name"]
            for x in r["repeats"]:  # every repeat trains the same steps: each is checked
                if len(x["losses"]) != len(ref["losses"]):
                    fail(f"{x['name']}: {len(x['losses'])} steps, {ref['name']} {len(ref['losses'])}")
                x["loss_rel_diff"] = [rel(a, b) for a, b in zip(x["losses"], ref["losses"])]
                for step, d in enumerate(x["loss_rel_diff"], start=1):
                    if not d <= loss_rtol(model, step, pdt):  # NaN fails too
                        bad.append(f"{x['name']}: step {step} loss {x['losses'][step - 1]!r} differs from "
                                   f"{ref['name']}'s {ref['losses'][step - 1]!r} by {d:.2e} relative "
                                   f"(tolerance {loss_rtol(model, step, pdt):g})")
            r["loss_rel_diff"] = [max(col) for col in zip(*(x["loss_rel_diff"] for x in r["repeats"]))]

    md = []
    md.append(f"CPU: {env['cpu']}; {threads} thread(s) per rank; load average at the start "
              f"{env['loadavg_start'].split()[:3]}, at the end {env.get('loadavg_end', '?').split()[:3]}.")
    spread = "; ".join(f"{t} thread(s): median {statistics.median(v):.1f} of {len(v)} readings "
                       f"{min(v):.1f}-{max(v):.1f} GFLOP/s" for t, v in sorted(readings.items()))
    md.append(f"Command: `{env['command']}`. sgemm peak: apps/sgemm_peak (2048^3, best of 5) just before each run, "
              f"at np x threads per rank threads, at most {ncpu}; each row's is the median of the bench's readings "
              f"at its thread count ({spread}).")
    executed = transformer_executed_step_flops(BATCH["transformer"], **BENCH_TRANSFORMER)
    counted = transformer_step_flops(BATCH["transformer"], **BENCH_TRANSFORMER)
    llama_executed = llama_step_flops(BATCH["llama"], executed=True, **BENCH_LLAMA)
    llama_counted = llama_step_flops(BATCH["llama"], **BENCH_LLAMA)
    md.append(f"GFLOP/s counts model FLOPs (jobs/bench_flops.py; attention over the full T x T, as PyTorch computes "
              f"it: the llama twin's scaled_dot_product_attention does at T 256). fsdp-hpc's host kernels skip most "
              f"masked attention blocks (causal row blocks of 32) and execute {100 * executed / counted:.1f}% of the "
              f"transformer's count and {100 * llama_executed / llama_counted:.1f}% of the llama's.")
    md.append("")
    md.append("| model | np | strategy | implementation | step (s) | tokens/s or samples/s | "
              "peak RSS per rank (MiB, max) | GFLOP/s (sgemm peak) | % of sgemm peak | loss vs reference (max rel.) |")
    md.append("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        unit = "tok/s" if r["model"] in SEQ_LEN else "samples/s"
        md.append(f"| {r['model']} | {r['np']} | {r['strategy']} | {r['impl']} | {r['median_step_s']:.3f} | "
                  f"{r['per_s']:.0f} {unit} | {max(r['rss_mib']):.0f} | {r['gflops']:.1f} ({r['peak_gflops']:.1f}) | "
                  f"{100 * r['frac_peak']:.0f}% | "
                  f"{max(r['loss_rel_diff']):.1e} |")
    if any(len(r["repeats"]) > 1 for r in results):
        md.append("")
        md.append("Each row pools the timed steps of its repeats; per repeat (in run order), the median step and "
                  "its % of the row's sgemm peak:")
        md.append("")
        md.append("| model | np | strategy | implementation | per repeat: step (s), % of sgemm peak |")
        md.append("|---|---:|---|---|---|")
        for r in results:
            each = ", ".join(f"{x['median_step_s']:.3f} ({100 * x['frac_peak']:.0f}%)" for x in r["repeats"])
            md.append(f"| {r['model']} | {r['np']} | {r['strategy']} | {r['impl']} | {each} |")
    md.append("")
    md.append("Per-step losses (the reference of each model is PyTorch FSDP2 at the smallest np; first repeat):")
    md.append("")
    steps = max(len(r["losses"]) for r in results)
    md.append("| run | " + " | ".join(f"step {s + 1}" for s in range(steps)) + " | max rel. diff |")
    md.append("|---|" + "---:|" * (steps + 1))
    for r in results:
        md.append(f"| {r['name']} | " + " | ".join(f"{x:.7f}" for x in r["losses"]) +
                  f" | {max(r['loss_rel_diff']):.1e} |")
    md.append("")
    within = (f"every model within {BF16_RTOL:g} (param_dtype {pdt})" if pdt != "f32" else
              f"transformer and llama within {loss_rtol('transformer', 1):g}; mnist_cnn within "
              f"{loss_rtol('mnist_cnn', 1):g} up to step {MNIST_TIGHT_STEPS}, {CHAOTIC_RTOL:g} after")
    md.append("Loss check: " + (f"PASS (relative to the reference: {within})" if not bad
                                else f"FAIL ({len(bad)} step(s) out of tolerance)"))
    md.append("")
    md.append("Peak RSS is /usr/bin/time's maximum resident set of each rank's process; importing torch "
              "2.15 (PyPI's CUDA build) alone takes ~0.5 GiB of it here.")
    text = "\n".join(md) + "\n"
    open(os.path.join(out, "table.md"), "w").write(text)
    json.dump({"env": env, "loss_check": "PASS" if not bad else bad, "runs": results},
              open(os.path.join(out, "results.json"), "w"), indent=1)
    print(text)
    plot(out, results)
    if bad:
        for b in bad:
            print("bench_peer_report: LOSS MISMATCH " + b, file=sys.stderr)
        sys.exit(1)


def plot(out, results):
    """peer.png: per model, throughput and peak RSS per rank against np, one line per run kind."""
    data = os.path.join(out, "plot")
    os.makedirs(data, exist_ok=True)
    panels = []
    for model in dict.fromkeys(r["model"] for r in results):
        series = []
        for key in ORDER:
            rows = sorted((r for r in results if r["model"] == model and r["key"] == key), key=lambda r: r["np"])
            if not rows:
                continue
            path = os.path.join(data, f"{model}_{key}.dat")
            with open(path, "w") as f:
                for r in rows:
                    f.write(f"{r['np']} {r['per_s']:.6g} {max(r['rss_mib']):.6g}\n")
            impl, strategy = IMPL[key]
            dash = 1 if key.startswith("ours") else 2
            series.append((path, f"{impl} {strategy}", dash, ORDER.index(key)))
        unit = "tokens/s" if model in SEQ_LEN else "samples/s"
        for col, ylabel in ((2, unit), (3, "peak RSS per rank (MiB)")):
            lines = ", ".join(f"'{p}' using 1:{col} with linespoints lw 2 dt {d} lc {i + 1} pt {i + 4} title '{t}'"
                              for p, t, d, i in series)
            panels.append(f"set title '{model}: {ylabel}'\nset ylabel '{ylabel}'\nplot {lines}")
    script = ["set terminal pngcairo size 1400,%d noenhanced font 'DejaVu Sans,10'" % (520 * (len(panels) // 2)),
              f"set output '{os.path.join(out, 'peer.png')}'",
              f"set multiplot layout {len(panels) // 2},2",
              "set xlabel 'ranks (np)'", "set yrange [0:*]", "set xtics 1", "set offsets 0.2, 0.2, 0, 0",
              "set grid", "set key below font ',9'"] + panels + ["unset multiplot"]
    r = subprocess.run(["gnuplot"], input="\n".join(script), text=True, capture_output=True)
    if r.returncode != 0:
        fail(f"gnuplot failed: {r.stderr.strip()[:300]}")
    print(f"bench_peer_report: wrote {os.path.join(out, 'table.md')}, results.json, peer.png")


if __name__ == "__main__":
    main()
