#!/usr/bin/python3
"""Our T5 (model.kind: t5) is Hugging Face's T5ForConditionalGeneration: both tiny configs
(v1_0: ReLU, tied embeddings; v1_1: gated-GELU, untied lm_head) trained 20 steps from the same
initial weights on the same batches, at one rank.

For each config (tests/reference/t5_<config>.yaml):
1. t5_pairs.py writes the data set (fortunes, JSON lines); t5_reference.py (transformers 4.36.2 in
   the venv of hf_venv.sh) writes HF's initial weights, per-step losses and final weights. Its data
   and batch settings are taken from the yaml file, whose model keys must equal t5_reference.py's.
2. fsdp_app runs the yaml file from HF's initial weights (model.init_from) and writes its metrics
   and, at the end, its consolidated checkpoint ckpt_<steps, 8 digits>.h5 (/model/<name>).
3. Loss per step: |ours - hf| / |hf| <= LOSS_RTOL at every step. HF's own float32 trajectory
   against the same in float64 differs by <= 1.1e-6 on every step (v1_0; 3.3e-7 v1_1), and with 2
   threads instead of 1 by 2e-7: an exact implementation sits well inside; a wrong formula (a
   missing d_model**-0.5 on the tied head, gelu instead of gelu_new, a bucket off by one) is far out.
4. Final weights: the same names (the tied aliases left out on both sides) and shapes, and per
   tensor ||ours - hf|| / ||hf|| <= PARAM_RTOL (the max abs difference is printed beside it).
5. Our checkpoint loads into a fresh T5ForConditionalGeneration through load_state_dict(strict=True)
   (the aliases filled from shared.weight), and HF's loss on the first batch with our weights equals
   the loss with HF's final weights to LOAD_LOSS_RTOL: the names and layouts are HF's.
6. Generation: `fsdp_app --generate 8` from HF's initial weights (random: varied outputs, unlike
   the 20-step model's repetitions) equals HF's generate() token for token on the first 8
   validation rows: greedy at np 1 and under mpirun -np 3 (FSDP gathers every unit once for the
   batch), beam search with 4 beams at np 1.

usage: check_t5.py BUILD_DIR|PATH/TO/fsdp_app OUT_DIR [--config v1_0|v1_1] [--steps N] [--set KEY=VALUE]
OUT_DIR/<config>/ keeps every file (data, HF's outputs, our metrics and checkpoint, logs).
Debian's /usr/bin/python3 with python3-h5py, python3-numpy, python3-yaml, python3-torch; the HF
venv is made on first use by hf_venv.sh (needs PyPI once). Exit 0 on PASS; otherwise the last line
is `check_t5: FAIL: ...` naming what failed, exit 1.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: pylib (and reference.t5_reference)
from pylib.launch import Fail, run_logged  # noqa: E402
from pylib.metrics import losses_by_step as losses_of  # noqa: E402
from pylib.report import Report  # noqa: E402
from pylib.reference import run_configs  # noqa: E402

PYTHON = "/usr/bin/python3"
LOSS_RTOL = 1e-5
PARAM_RTOL = 1e-4
LOAD_LOSS_RTOL = 1e-6
GENERATE_N = 8
CONFIGS = ["v1_0", "v1_1"]
R = Report()  # one case per config


def run(cmd, log, timeout=300):
    """Runs cmd with its output in log; returns its wall seconds; raises Fail on a non-zero exit
    naming the last line of ours (fsdp_app, t5_reference.py, t5_pairs.py) in the log."""
    return run_logged(cmd, log, timeout, prefixes=("fsdp_app:", "t5_reference:", "t5_pairs.py:"))


def rel(a, b):
    return abs(a - b) / abs(b) if b != 0 else abs(a - b)


def read_group(path, group="model"):
    out = {}
    with h5py.File(path, "r") as f:
        if group not in f:
            raise Fail(f"{path}: no /{group} group")
        f[group].visititems(lambda n, o: out.__setitem__(n, o[...]) if isinstance(o, h5py.Dataset) else None)
    return out


# ---- the comparisons (no fsdp_app, no transformers: testable on the reference's own files) -----------

def settings_of(cfg_name, doc, steps=None):
    """t5_reference.py's arguments from the yaml file; raises Fail when its model keys are not HF's."""
    from reference.t5_reference import CONFIGS as HF, YAML_MODEL_KEYS
    model = dict(doc.get("model", {}))
    if model.pop("kind", None) != "t5":
        raise Fail(f"t5_{cfg_name}.yaml: model.kind is not t5")
    model.pop("init_from", None)
    want = {k: HF[cfg_name][k] for k in YAML_MODEL_KEYS}
    diff = sorted(set(model) ^ set(want)) + sorted(k for k in set(model) & set(want) if model[k] != want[k])
    if diff:
        raise Fail(f"t5_{cfg_name}.yaml: model keys differ from t5_reference.py's CONFIGS[{cfg_name!r}]: "
                   + ", ".join(f"{k} {model.get(k)!r} vs {want.get(k)!r}" for k in diff))
    data, train = doc["data"], doc["train"]
    opt = train["optimizer"]
    expect = {"data.kind": (data.get("kind"), "seq2seq"), "data.source": (data.get("source"), "text"),
              "data.target": (data.get("target"), "headline"), "optimizer": (opt.get("kind"), "adamw"),
              "lr": (opt.get("lr"), 1e-3), "betas": (list(opt.get("betas", [])), [0.9, 0.999]),
              "eps": (opt.get("eps"), 1e-8), "weight_decay": (opt.get("weight_decay"), 0.01),
              "scheduler": (train.get("scheduler", {}).get("kind"), "none"), "shuffle": (train.get("shuffle"), False),
              "dropout": (train.get("dropout"), False), "seed": (train.get("seed"), 1)}
    bad = [f"{k} {got!r} (t5_reference.py uses {w!r})" for k, (got, w) in expect.items() if got != w]
    if bad:
        raise Fail(f"t5_{cfg_name}.yaml: " + ", ".join(bad))
    return {"steps": steps or train["steps"], "batch": train["global_batch_size"], "source_len": data["source_len"],
            "target_len": data["target_len"], "eval_fraction": data["eval_fraction"]}


def compare_losses(cfg_name, hf, ours):
    """hf: [loss of step 1..n]; ours: {step: loss}. Prints the table; returns (failed steps, worst)."""
    print(f"{'step':>4} {'hf':>14} {'ours':>14} {'rel diff':>9}")
    bad, worst = [], 0.0
    for s, h in enumerate(hf, start=1):
        o = ours.get(s)
        r = rel(o, h) if o is not None and math.isfinite(o) else float("inf")
        worst = max(worst, r)
        mark = "" if r <= LOSS_RTOL else "  FAIL"
        if mark:
            bad.append(s)
        print(f"{s:>4} {h:>14.9g} {('missing' if o is None else f'{o:.9g}'):>14} {r:>9.2e}{mark}")
    extra = sorted(set(ours) - set(range(1, len(hf) + 1)))
    if extra:
        print(f"{cfg_name}: ours has steps HF does not: {extra}")
        bad += extra
    print(f"{cfg_name}: loss: {'PASS' if not bad else f'FAIL at steps {bad}'}: max rel diff {worst:.2e} over "
          f"{len(hf)} steps (tol {LOSS_RTOL:g})", flush=True)
    return bad, worst


def compare_params(cfg_name, hf, ours):
    """{name: array} each. Prints every tensor's max abs and relative L2; returns (failures, worst)."""
    only_hf, only_ours = sorted(set(hf) - set(ours)), sorted(set(ours) - set(hf))
    problems = []
    if only_hf:
        problems.append(f"missing from our checkpoint: {only_hf}")
    if only_ours:
        problems.append(f"only in our checkpoint: {only_ours}")
    width = max(len(n) for n in hf)
    print(f"{'tensor':<{width}} {'shape':>10} {'max abs':>9} {'rel L2':>9}")
    worst = (0.0, "")
    for name in sorted(set(hf) & set(ours)):
        h, o = hf[name].astype(np.float64), ours[name].astype(np.float64)
        if h.shape != o.shape:
            problems.append(f"{name}: shape {o.shape}, HF {h.shape}")
            print(f"{name:<{width}} {'x'.join(map(str, h.shape)):>10}  shape {o.shape}: FAIL")
            continue
        d = o - h
        norm = np.linalg.norm(h)
        e = float(np.linalg.norm(d) / norm) if norm > 0 else float(np.linalg.norm(d))
        if not math.isfinite(e):
            e = float("inf")
        worst = max(worst, (e, name))
        mark = "" if e <= PARAM_RTOL else "  FAIL"
        if mark:
            problems.append(f"{name} rel L2 {e:.2e}")
        print(f"{name:<{width}} {'x'.join(map(str, h.shape)):>10} {float(np.max(np.abs(d))) if d.size else 0.0:>9.2e} "
              f"{e:>9.2e}{mark}")
    print(f"{cfg_name}: final weights: {'PASS' if not problems else 'FAIL'}: {len(set(hf) & set(ours))} tensors, "
          f"worst rel L2 {worst[0]:.2e} ({worst[1]}) (tol {PARAM_RTOL:g})"
          + ("" if not problems else "; " + "; ".join(problems[:4])), flush=True)
    return problems, worst


def compare_load(cfg_name, ours_loss, hf_loss):
    r = rel(ours_loss, hf_loss)
    ok = r <= LOAD_LOSS_RTOL
    print(f"{cfg_name}: loads into HF: {'PASS' if ok else 'FAIL'}: first-batch loss with our checkpoint "
          f"{ours_loss:.9g}, with HF's final weights {hf_loss:.9g}, rel diff {r:.2e} (tol {LOAD_LOSS_RTOL:g})",
          flush=True)
    return ok, r


def check_generate(app, py, cfg_name, d, yaml_path, pairs, common, t):
    """Step 6: our --generate against HF's generate() from the same (initial) weights."""
    init = os.path.join(d, "init.h5")
    log = os.path.join(d, "hf_generate.log")
    t["hf generate"] = run([py, os.path.join(HERE, "t5_reference.py")] + common +
                           ["--generate", init, "--generate-n", str(GENERATE_N), "--generate-beams", "4"], log)
    hf = json.loads(open(log).read().strip().splitlines()[-1])
    mpirun = os.path.join(os.path.dirname(HERE), "mpirun.sh")
    fails = []
    for name, launch, beams in (("greedy np 1", [], 1), ("greedy np 3", [mpirun, "3"], 1),
                                ("beam 4 np 1", [], 4)):
        out = os.path.join(d, f"generate_{name.replace(' ', '_')}.jsonl")
        cmd = launch + app + [yaml_path, "--set", f"model.init_from={init}", "--set", f"data.path={pairs}",
                              "--set", f"generate.num_beams={beams}", "--set", "train.global_batch_size=0",
                              "--set", "train.batch_size=1", "--set", "generate.batch_size=3",
                              "--generate", str(GENERATE_N)]
        with open(out, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=300)
        rows = [json.loads(line) for line in open(out) if line.startswith("{")]
        ours = [row["generated_ids"] for row in rows]
        want = hf["greedy" if beams == 1 else "beam"]
        same = sum(o == h for o, h in zip(ours, want))
        ok = r.returncode == 0 and len(ours) == len(want) and same == len(want)
        print(f"{cfg_name}: generate {name}: {'PASS' if ok else 'FAIL'}: {same} of {len(want)} rows equal to HF's "
              f"generate() token for token ({sum(map(len, want))} tokens; exit {r.returncode}; {out})", flush=True)
        if not ok:
            fails.append(f"{cfg_name} generate {name}: {same} of {len(want)} rows equal to HF's")
    return fails


# ---- one config -------------------------------------------------------------------------------------

def check_config(app, py, cfg_name, out, steps, sets):
    d = os.path.join(out, cfg_name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    yaml_path = os.path.join(HERE, f"t5_{cfg_name}.yaml")
    with open(yaml_path) as f:
        st = settings_of(cfg_name, yaml.safe_load(f), steps)
    t = {}
    pairs = os.path.join(d, "pairs.jsonl")
    print(f"== {cfg_name}: data, Hugging Face reference ({st['steps']} steps)", flush=True)
    t["data"] = run([PYTHON, os.path.join(HERE, "t5_pairs.py"), pairs], os.path.join(d, "pairs.log"))
    common = ["--config", cfg_name, "--data", pairs, "--batch", str(st["batch"]), "--source-len",
              str(st["source_len"]), "--target-len", str(st["target_len"]), "--eval-fraction", str(st["eval_fraction"])]
    t["hf"] = run([py, os.path.join(HERE, "t5_reference.py")] + common + ["--out", d, "--steps", str(st["steps"])],
                  os.path.join(d, "hf.log"))
    hf_losses = json.load(open(os.path.join(d, "hf_losses.json")))["losses"]

    print(f"== {cfg_name}: fsdp_app (np 1)", flush=True)
    ck = os.path.join(d, "ck")
    metrics = os.path.join(d, "ours.jsonl")
    t["app"] = run(app + [yaml_path, "--set", f"model.init_from={d}/init.h5", "--set", f"data.path={pairs}",
                          "--set", f"output.metrics={metrics}", "--set", f"train.steps={st['steps']}",
                          "--set", f"checkpoint.dir={ck}", "--set", "checkpoint.format=consolidated"]
                   + [a for kv in sets for a in ("--set", kv)], os.path.join(d, "app.log"))
    final = os.path.join(ck, f"ckpt_{st['steps']:08d}.h5")
    if not os.path.exists(final):
        raise Fail(f"{cfg_name}: fsdp_app wrote no final checkpoint {final} "
                   f"(found {sorted(os.listdir(ck)) if os.path.isdir(ck) else 'no folder'})")

    fails = []
    bad_steps, worst_loss = compare_losses(cfg_name, hf_losses, losses_of(metrics))
    if bad_steps:
        fails.append(f"{cfg_name} loss at steps {bad_steps} (max rel diff {worst_loss:.2e} > {LOSS_RTOL:g})")
    problems, worst_param = compare_params(cfg_name, read_group(os.path.join(d, "final.h5")), read_group(final))
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        fails.append(f"{cfg_name} final weights: {problems[0]}{more}")
    if not any("missing" in p or "only in" in p or "shape" in p for p in problems):
        log = os.path.join(d, "load.log")
        t["load"] = run([py, os.path.join(HERE, "t5_reference.py")] + common +
                        ["--loss-of", final, os.path.join(d, "final.h5")], log)
        got = json.loads(open(log).read().strip().splitlines()[-1])
        ok, r_load = compare_load(cfg_name, got[final], got[os.path.join(d, "final.h5")])
        if not ok:
            fails.append(f"{cfg_name} our checkpoint in HF: first-batch loss rel diff {r_load:.2e} > "
                         f"{LOAD_LOSS_RTOL:g}")
    else:
        r_load = float("nan")
        print(f"{cfg_name}: loads into HF: not tried (names or shapes differ)")
    gen_fails = check_generate(app, py, cfg_name, d, yaml_path, pairs, common, t)
    fails += gen_fails
    times = ", ".join(f"{k} {v:.1f} s" for k, v in t.items())
    R.check(cfg_name, not fails, f"loss max rel diff {worst_loss:.2e} (tol {LOSS_RTOL:g}), final weights worst rel L2 "
            f"{worst_param[0]:.2e} (tol {PARAM_RTOL:g}), HF load loss rel diff {r_load:.2e} (tol {LOAD_LOSS_RTOL:g}); "
            f"{times}")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("app", help="the build folder, or fsdp_app itself")
    ap.add_argument("out", help="output folder (OUT/<config>/ is replaced)")
    ap.add_argument("--config", action="append", choices=CONFIGS)
    ap.add_argument("--steps", type=int, default=None, help="default: the yaml's train.steps (20)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to every fsdp_app run (to see the check fail on a changed formula)")
    args = ap.parse_args()
    app = os.path.join(args.app, "apps", "fsdp_app") if os.path.isdir(args.app) else args.app
    if not os.access(app, os.X_OK):
        raise SystemExit(f"check_t5: FAIL: no fsdp_app executable at {app}")
    os.makedirs(args.out, exist_ok=True)

    def check_one(cfg_name, py):
        t1 = time.time()
        try:
            return check_config([app], py, cfg_name, os.path.abspath(args.out), args.steps, args.set)
        finally:
            print(f"{cfg_name}: {time.time() - t1:.1f} s", flush=True)

    run_configs("check_t5", R, args.config or CONFIGS, check_one)


if __name__ == "__main__":
    main()
