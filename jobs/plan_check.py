#!/usr/bin/env python3
"""The timed plan against measured runs on this machine (docs/performance.md, "Timed plan").

  /usr/bin/python3 jobs/plan_check.py --app build/apps/fsdp_app --cluster FILE [--out TABLE.md]
                                      [--quick] [--rows transformer,t5] [--steps 5]

For each row (model x np x strategy x backend) it trains `--steps` steps under mpirun and takes
the median step_time_s of the steps after the first (which pays for allocation), then asks
`fsdp_app --plan --world-size N --ranks-per-node N --cluster FILE` with the same --set keys for
the predicted step, and prints a Markdown table with the error of each row (predicted / measured
- 1). OPENBLAS_NUM_THREADS = cores / np (at least 1), as jobs/calibrate-cluster.sh assumed.
--quick: np 1 and 2, FULL_SHARD and NO_SHARD, mpi only.
--measured TABLE.md: take the measured steps of an earlier table (its rows) instead of running
them again: a new cluster file or model of the cost is checked against the same measurements.
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
        if len(cells) == 9 and cells[1].isdigit():
            rows[(cells[0], int(cells[1]), cells[2], cells[3])] = float(cells[4])
    return rows


def run_row(args, model, np, strategy, backend, work, measured_before):
    sets = MODELS[model] + [c.format(steps=args.steps) for c in COMMON]
    sets += [f"fsdp.sharding_strategy={strategy}", f"comm.backend={backend}"]
    if strategy == "HYBRID_SHARD":
        sets.append(f"fsdp.hybrid.shard_group_size={np // 2}")  # 2 replicas of np/2
    metrics = os.path.join(work, f"{model}_{np}_{strategy}_{backend}.jsonl")
    set_args = [a for s in sets for a in ("--set", s)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(max(1, os.cpu_count() // np)), OMP_NUM_THREADS=str(max(1, os.cpu_count() // np)))
    base = os.path.join(work, "base.yaml")  # every key comes from --set: one file for every model
    with open(base, "w") as f:
        f.write("train: {eval_every: never}\n")
    cmd = ["mpirun", "-np", str(np), args.app, base] + set_args + ["--set", f"output.metrics={metrics}"]
    if (model, np, strategy, backend) in measured_before:
        measured = measured_before[(model, np, strategy, backend)]
    else:
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, timeout=900)
        steps = [json.loads(l) for l in open(metrics) if '"step_time_s"' in l]
        measured = statistics.median(s["step_time_s"] for s in steps[1:])
    plan = subprocess.run([args.app, base, "--plan", "--world-size", str(np), "--ranks-per-node", str(np),
                           "--cluster", args.cluster] + set_args, check=True, capture_output=True, text=True).stdout
    m = re.search(r"^  step\s+([\d.]+) s", plan, re.M)
    exposed = re.search(r"^  exposed comm\s+([\d.]+) s", plan, re.M)
    compute = re.search(r"^  compute\s+([\d.]+) s", plan, re.M)
    return measured, float(m.group(1)), float(compute.group(1)), float(exposed.group(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--app", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--out", default="")
    p.add_argument("--rows", default="transformer,t5")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--measured", default="")
    args = p.parse_args()
    for k in ("OMPI_MCA_rmaps_base_oversubscribe", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        os.environ.setdefault(k, "1")
    lines = ["| model | np | strategy | backend | measured step (s) | predicted (s) | compute (s) | exposed comm (s) | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    errors = []
    before = earlier(args.measured) if args.measured else {}
    with tempfile.TemporaryDirectory() as work:
        for model, np, strategy, backend in rows(args):
            measured, predicted, compute, exposed = run_row(args, model, np, strategy, backend, work, before)
            err = predicted / measured - 1
            errors.append(abs(err))
            lines.append(f"| {model} | {np} | {strategy} | {backend} | {measured:.3f} | {predicted:.3f} | {compute:.3f} | "
                         f"{exposed:.3f} | {100 * err:+.1f}% |")
            print(lines[-1], flush=True)
    summary = (f"{len(errors)} rows: median |error| {100 * statistics.median(errors):.1f}%, "
               f"max {100 * max(errors):.1f}%, {sum(e <= 0.15 for e in errors)} within 15%")
    print(summary)
    if args.out:
        open(args.out, "w").write("\n".join(lines) + "\n\n" + summary + "\n")


if __name__ == "__main__":
    sys.exit(main())
