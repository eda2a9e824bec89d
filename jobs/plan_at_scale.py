#!/usr/bin/env python3
"""Predicted per-GPU throughput at internet scale, on paper: the timed plan (`fsdp_app --plan
--cluster`) of Llama-3-class shapes on 1 to 4096 GPUs, every strategy, as a Markdown table
(docs/performance.md, "At scale").

  /usr/bin/python3 jobs/plan_at_scale.py [--cluster dgx-h100] --app build/apps/fsdp_app
      [--models llama3-8b,llama3-70b] [--nps 1,8,64,512,4096] [--out FILE.md]

Each model runs as close to torchtitan's Llama 3 8B anchor as this code allows: seq 8192, local
batch 2, param_dtype and reduce_dtype bf16 (input/llama3_8b.yaml), GEMMs on bf16 operands
(train.matmul_precision medium: our mixed precision keeps activations in f32, issue 38),
activation checkpointing of every layer (torchtitan: selective), NCCL. Attention is ours today:
the (T, T) probabilities materialised, the full square computed (no flash attention for Llama). A row the memory plan says does not fit in the
GPU's memory is marked; a configuration the run refuses (a world size the strategy cannot split)
shows the refusal.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODELS = {
    "llama3-8b": ["model.preset=meta-llama/Meta-Llama-3-8B"],
    "llama3-70b": ["model.preset=meta-llama/Meta-Llama-3-70B"],
    # For the test of this script: a tiny Llama on the same path.
    "tiny": ["model.preset=TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "model.vocab_size=256", "model.hidden_size=64", "model.intermediate_size=128",
             "model.num_hidden_layers=2", "model.num_attention_heads=4", "model.num_key_value_heads=2",
             "model.seq_len=64"],
}
COMMON = ["model.seq_len=8192", "train.batch_size=2", "train.device=cuda", "comm.backend=nccl",
          "train.matmul_precision=medium", "data.synthetic_samples=16384",
          "fsdp.mixed_precision.param_dtype=bf16", "fsdp.activation_checkpointing=true"]
STRATEGIES = ["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"]


def plan(app, cluster, model, np, strategy):
    sets = COMMON + MODELS[model] + [f"fsdp.sharding_strategy={strategy}"]
    cmd = [app, os.path.join(ROOT, "input", "llama3_8b.yaml"), "--plan", "--world-size", str(np), "--cluster", cluster]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
    out = r.stdout
    step = float(re.search(r"^  step\s+([\d.]+) s", out, re.M).group(1))
    per_rank = re.search(r"tokens/s \((\d+) per rank\)", out)
    mfu = float(re.search(r"^  MFU\s+([\d.]+) %", out, re.M).group(1))
    exposed = float(re.search(r"^  exposed comm\s+([\d.]+) s", out, re.M).group(1))
    device = re.search(r"^  device\s+([\d.]+ \w+)", out, re.M)
    total = re.search(r"^  total\s+([\d.]+ \w+)", out, re.M)
    mem = (device or total).group(1)
    return {"step": step, "tps": int(per_rank.group(1)) if per_rank else 0, "mfu": mfu, "exposed": exposed,
            "mem": mem}, None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--app", required=True)
    p.add_argument("--cluster", default="dgx-h100")
    p.add_argument("--models", default="llama3-8b,llama3-70b")
    p.add_argument("--nps", default="1,8,64,512,4096")
    p.add_argument("--out", default="")
    p.add_argument("--require-all", action="store_true", help="exit 1 when any row is refused (the test's check)")
    a = p.parse_args()
    refused = 0
    lines = [f"Predicted by `fsdp_app --plan --cluster {a.cluster}` (jobs/plan_at_scale.py): seq 8192, local batch 2, "
             "param_dtype bf16, bf16 GEMM operands (matmul_precision medium), activation checkpointing, NCCL.", "",
             "| model | GPUs | strategy | step (s) | tokens/s per GPU | MFU | exposed comm (s) | memory per GPU |",
             "|---|---|---|---|---|---|---|---|"]
    for model in a.models.split(","):
        for np in [int(n) for n in a.nps.split(",")]:
            for strategy in STRATEGIES:
                r, err = plan(a.app, a.cluster, model, np, strategy)
                if r is None:
                    refused += 1
                    lines.append(f"| {model} | {np} | {strategy} | refused: {err} | | | | |")
                else:
                    lines.append(f"| {model} | {np} | {strategy} | {r['step']:.3f} | {r['tps']:,} | {r['mfu']:.1f}% | "
                                 f"{r['exposed']:.3f} | {r['mem']} |")
                print(lines[-1], flush=True)
    if a.out:
        open(a.out, "w").write("\n".join(lines) + "\n")
    if a.require_all and refused:
        print(f"plan_at_scale: {refused} rows refused")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
