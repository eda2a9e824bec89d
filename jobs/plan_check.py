#!/usr/bin/env python3
"""The timed plan against measured runs on this machine (docs/performance.md, "Timed plan").

  /usr/bin/python3 jobs/plan_check.py --app build/apps/fsdp_app --cluster FILE [--out TABLE.md]
                                      [--quick] [--rows transformer,t5] [--steps 5]

For each row (model x np x strategy x backend) it trains `--steps` steps under mpirun and takes
the median step_time_s of the steps after the first (which pays for allocation), then asks
`fsdp_app --plan --world-size N --ranks-per-node N --cluster FILE` with the same --set keys for
the predicted step, and prints a Markdown table with the error of each row (predicted / measured
- 1). One BLAS and OpenMP thread per rank: the plan's device is one core, as
jobs/calibrate-cluster.sh measures it.
--quick: np 1 and 2, FULL_SHARD and NO_SHARD, mpi only.
--measured TABLE.md: take the measured steps of an earlier table (its rows) instead of running
them again: a new cluster file or model of the cost is checked against the same measurements.
--track-drift (a cluster file from jobs/calibrate-cluster.sh): a VM's core does not keep one speed
(measured here: sgemm 512^3 at 27.5 GFLOP/s, then 16.0 twenty minutes later, nothing else running).
Before and after each row the script measures the core as the calibration did (sgemm_peak 512^3,
one thread, median of 20) and predicts the row with the file's GEMM and memory rates scaled by the
mean of the two over the calibrated rate: what is checked is the model, not the machine's drift.
The table's last column is that scale.
Not a test itself: timings on a shared machine vary; run it on an idle node.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

MODELS = {
    # The bench transformer's layer shapes (input/transformer_bench.yaml) at 4 layers and seq 128,
    # one sample a rank (np 8 on 2 cores: about 5 s a step).
    "transformer": ["model.kind=transformer", "model.vocab=256", "model.d_model=512", "model.n_layers=4",
                    "model.n_heads=8", "model.d_ff=2048", "model.seq_len=128", "data.kind=synthetic",
                    "data.synthetic_samples=512", "train.batch_size=1", "fsdp.auto_wrap.policy=transformer_layer",
                    "train.optimizer.kind=adamw"],
    # A small T5 (4 + 4 blocks of d_model 256), source 128 and target 24 tokens, two samples a rank.
    "t5": ["model.kind=t5", "model.vocab_size=8000", "model.d_model=256", "model.d_kv=32", "model.num_heads=8",
           "model.d_ff=1024", "model.num_layers=4", "model.num_decoder_layers=4", "data.kind=synthetic",
           "data.synthetic_samples=512", "data.source_len=128", "data.target_len=24", "train.batch_size=2",
           "fsdp.auto_wrap.policy=transformer_layer", "train.optimizer.kind=adamw"],
    # Tiny: for the test of this script only.
    "tiny": ["model.kind=transformer", "model.vocab=64", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
             "model.d_ff=64", "model.seq_len=16", "data.kind=synthetic", "data.synthetic_samples=64",
             "train.batch_size=2", "fsdp.auto_wrap.policy=transformer_layer"],
}
COMMON = ["output.log_every=1000", "train.steps={steps}"]


def rows(args):
    nps = [1, 2] if args.quick else [1, 2, 4, 8]
    strategies = ["FULL_SHARD", "NO_SHARD"] if args.quick else ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
    backends = ["mpi"] if args.quick else ["mpi", "ucx"]
    for model in args.rows.split(","):
        for np in nps:
            for strategy in strategies if np > 1 else ["FULL_SHARD"]:
                if strategy == "HYBRID_SHARD" and np < 4:
                    continue
                for backend in backends:
                    yield model, np, strategy, backend


def earlier(path):
    """{(model, np, strategy, backend): measured step} from a table this script wrote."""
    rows = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 9 and cells[1].isdigit():
            rows[(cells[0], int(cells[1]), cells[2], cells[3])] = float(cells[4])
    return rows


def core_gflops(args):
    """The core's sgemm rate now, measured as jobs/calibrate-cluster.sh measures it."""
    sgemm = os.path.join(os.path.dirname(args.app), "sgemm_peak")
    out = subprocess.run([sgemm, "--threads", "1", "--size", "512", "--reps", "20"], check=True,
                         capture_output=True, text=True).stdout
    return float(re.search(r"median ([\d.]+) GFLOP/s", out).group(1))


def scaled_cluster(text, scale):
    """The cluster file's text with its GEMM and memory rates times scale."""
    def times(m):
        return f"{m.group(1)}{float(m.group(2)) * scale:.5g}"
    text = re.sub(r"((?:f32|tf32|bf16):\s*)([\d.]+)", times, text)
    return re.sub(r"^((?:memory_GBps|host_link_GBps):\s*)([\d.]+)", times, text, flags=re.M)


def run_row(args, model, np, strategy, backend, work, measured_before):
    sets = MODELS[model] + [c.format(steps=args.steps) for c in COMMON]
    sets += [f"fsdp.sharding_strategy={strategy}", f"comm.backend={backend}"]
    if strategy == "HYBRID_SHARD":
        sets.append(f"fsdp.hybrid.shard_group_size={np // 2}")  # 2 replicas of np/2
    metrics = os.path.join(work, f"{model}_{np}_{strategy}_{backend}.jsonl")
    set_args = [a for s in sets for a in ("--set", s)]
    # One thread per rank at every np: the plan's device is one core (jobs/calibrate-cluster.sh),
    # so np 1 runs on one core too, as predicted.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    base = os.path.join(work, "base.yaml")  # every key comes from --set: one file for every model
    with open(base, "w") as f:
        f.write("train: {eval_every: never}\n")
    cmd = ["mpirun", "-np", str(np), args.app, base] + set_args + ["--set", f"output.metrics={metrics}"]
    scale, cluster = 1.0, args.cluster
    if (model, np, strategy, backend) in measured_before:
        measured = measured_before[(model, np, strategy, backend)]
    else:
        before = core_gflops(args) if args.track_drift else 0
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, timeout=900)
        steps = [json.loads(l) for l in open(metrics) if '"step_time_s"' in l]
        measured = statistics.median(s["step_time_s"] for s in steps[1:])
        if args.track_drift:
            text = open(args.cluster).read()
            calibrated = float(re.search(r"f32:\s*([\d.]+)", text).group(1)) * 1000
            scale = (before + core_gflops(args)) / 2 / calibrated
            cluster = os.path.join(work, "cluster_now.yaml")
            open(cluster, "w").write(scaled_cluster(text, scale))
    plan = subprocess.run([args.app, base, "--plan", "--world-size", str(np), "--ranks-per-node", str(np),
                           "--cluster", cluster] + set_args, check=True, capture_output=True, text=True).stdout
    m = re.search(r"^  step\s+([\d.]+) s", plan, re.M)
    exposed = re.search(r"^  exposed comm\s+([\d.]+) s", plan, re.M)
    compute = re.search(r"^  compute\s+([\d.]+) s", plan, re.M)
    return measured, float(m.group(1)), float(compute.group(1)), float(exposed.group(1)), scale


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--app", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--out", default="")
    p.add_argument("--rows", default="transformer,t5")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--measured", default="")
    p.add_argument("--track-drift", action="store_true")
    args = p.parse_args()
    for k in ("OMPI_MCA_rmaps_base_oversubscribe", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        os.environ.setdefault(k, "1")
    lines = ["| model | np | strategy | backend | measured step (s) | predicted (s) | compute (s) | exposed comm (s) | error | core speed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    errors = []
    before = earlier(args.measured) if args.measured else {}
    with tempfile.TemporaryDirectory() as work:
        for model, np, strategy, backend in rows(args):
            measured, predicted, compute, exposed, scale = run_row(args, model, np, strategy, backend, work, before)
            err = predicted / measured - 1
            errors.append(abs(err))
            lines.append(f"| {model} | {np} | {strategy} | {backend} | {measured:.3f} | {predicted:.3f} | {compute:.3f} | "
                         f"{exposed:.3f} | {100 * err:+.1f}% | {scale:.2f} |")
            print(lines[-1], flush=True)
    summary = (f"{len(errors)} rows: median |error| {100 * statistics.median(errors):.1f}%, "
               f"max {100 * max(errors):.1f}%, {sum(e <= 0.15 for e in errors)} within 15%")
    print(summary)
    if args.out:
        open(args.out, "w").write("\n".join(lines) + "\n\n" + summary + "\n")


if __name__ == "__main__":
    sys.exit(main())
