#!/usr/bin/python3
"""Hugging Face checkpoints in and out, against transformers 4.36.2 (the venv of hf_venv.sh).

Out: fsdp_app trains the tiny T5s of check_t5.py (t5_v1_0.yaml: tied, relu; t5_v1_1.yaml: untied,
   gated-gelu) 4 steps at np 2 under mpirun from its own init, saving a sharded checkpoint after
   step 3. `fsdp_ckpt export-hf` (np 2) turns it into a model folder, which
   T5ForConditionalGeneration.from_pretrained loads with no missing, unexpected or mismatched
   keys, and HF's loss on training batch 4 (index 3) with those weights equals the loss fsdp_app
   reported for step 4 (computed with the same weights) to LOSS_RTOL. The bf16 export
   (`--dtype bf16`) is loaded back by fsdp_app (model.init_from: the folder) and by HF: their
   losses on batch 1 agree to LOSS_RTOL.
In: HF's own init written by save_pretrained with a small max_shard_size (the
   model.safetensors.index.json form; v1_0 in float32, v1_1 in bfloat16) is fsdp_app's
   model.init_from (np 2; the yaml's model keys must agree with config.json): fsdp_app's first-step
   loss equals HF's loss on that batch with those weights to LOSS_RTOL.
Transformer (no transformers class matches it; export-hf writes our names and model_type
   fsdp_transformer): its exported folder as model.init_from gives bitwise the first-step loss of
   the checkpoint it came from as model.init_from.
Damage: the same folder with one shard cut short makes fsdp_app (np 2) exit 1 with one line
   naming that file.

usage: check_hf_io.py BUILD_DIR OUT_DIR     (OUT_DIR keeps every file and log)
Exit 0 on PASS; otherwise the last line is `check_hf_io: FAIL: ...`, exit 1.
"""
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: pylib
from pylib import launch  # noqa: E402
from pylib.launch import Fail  # noqa: E402
from pylib.metrics import losses_by_step as losses_of  # noqa: E402
from pylib.report import Report  # noqa: E402
from pylib.venv import hf_python  # noqa: E402
from reference.check_t5 import rel, run  # noqa: E402

PYTHON = "/usr/bin/python3"
LOSS_RTOL = 1e-5
MPIRUN = launch.mpirun(2)
R = Report()


def hf(py, args, log):
    run([py, os.path.join(HERE, "hf_io.py")] + args, log)
    return json.loads(open(log).read().strip().splitlines()[-1])


def check(fails, what, ours, theirs):
    r = rel(ours, theirs)
    ok = R.check(what, r <= LOSS_RTOL, f"fsdp_app {ours:.9g}, transformers {theirs:.9g}, rel diff {r:.2e} "
                 f"(tol {LOSS_RTOL:g})")
    if not ok:
        fails.append(f"{what}: rel diff {r:.2e}")


def app_run(build, cfg, sets, log):
    """fsdp_app at np 2 on t5_<cfg>.yaml (or transformer.yaml); returns {step: loss}."""
    metrics = log.replace(".log", ".jsonl")
    yaml_file = os.path.join(HERE, "transformer.yaml" if cfg == "transformer" else f"t5_{cfg}.yaml")
    run(["timeout", "300"] + MPIRUN + [os.path.join(build, "apps", "fsdp_app"), yaml_file,
                                       "--set", f"output.metrics={metrics}"] +
        [a for kv in sets for a in ("--set", kv)], log)
    return losses_of(metrics)


def out_direction(build, py, out, pairs, cfg, fails):
    d = os.path.join(out, f"out_{cfg}")
    os.makedirs(d)
    ck = os.path.join(d, "ck")
    ours = app_run(build, cfg, [f"data.path={pairs}", "train.steps=4", f"checkpoint.dir={ck}",
                                "checkpoint.every_steps=3", "checkpoint.keep=2", "checkpoint.format=sharded"],
                   os.path.join(d, "train.log"))
    ckpt = os.path.join(ck, "ckpt_00000003.h5")
    ckpt_tool = os.path.join(build, "apps", "fsdp_ckpt")
    f32, bf16 = os.path.join(d, "hf_f32"), os.path.join(d, "hf_bf16")
    run(["timeout", "120"] + MPIRUN + [ckpt_tool, "export-hf", ckpt, f32], os.path.join(d, "export_f32.log"))
    run(["timeout", "120", ckpt_tool, "export-hf", ckpt, bf16, "--dtype", "bf16"], os.path.join(d, "export_bf16.log"))
    for folder in (f32, bf16):
        if sorted(os.listdir(folder)) != ["config.json", "model.safetensors"]:
            raise Fail(f"{folder} holds {sorted(os.listdir(folder))}, not config.json and model.safetensors")
    again = subprocess.run([ckpt_tool, "export-hf", ckpt, f32], capture_output=True, text=True, timeout=60)
    want = f"fsdp_ckpt: {f32}/model.safetensors exists (use --force to replace it)"
    if not R.check(f"out {cfg}: export-hf into an exported folder refuses", again.returncode == 1 and
                   again.stderr.strip() == want, f"exit {again.returncode}, {again.stderr.strip()!r}"):
        fails.append(f"export-hf into an exported folder: exit {again.returncode}, {again.stderr.strip()!r}, "
                     f"expected exit 1 and {want!r}")
    data = ["--data", pairs]
    theirs = hf(py, ["loss", "--config", cfg, "--model", f32, "--batch-index", "3"] + data,
                os.path.join(d, "hf_f32.log"))
    check(fails, f"out {cfg} f32: step 4 loss with the exported step-3 weights", ours[4], theirs["loss"])
    theirs = hf(py, ["loss", "--config", cfg, "--model", bf16, "--batch-index", "0"] + data,
                os.path.join(d, "hf_bf16.log"))
    back = app_run(build, cfg, [f"data.path={pairs}", "train.steps=1", f"model.init_from={bf16}"],
                   os.path.join(d, "init_bf16.log"))
    check(fails, f"out {cfg} bf16: batch 1 loss with the exported bf16 weights, loaded by both", back[1],
          theirs["loss"])


def transformer(build, out, fails):
    d = os.path.join(out, "out_transformer")
    os.makedirs(d)
    ck, folder = os.path.join(d, "ck"), os.path.join(d, "hf")
    app_run(build, "transformer", ["train.steps=3", f"checkpoint.dir={ck}", "checkpoint.format=consolidated"],
            os.path.join(d, "train.log"))
    ckpt = os.path.join(ck, "ckpt_00000003.h5")
    run(["timeout", "120"] + MPIRUN + [os.path.join(build, "apps", "fsdp_ckpt"), "export-hf", ckpt, folder],
        os.path.join(d, "export.log"))
    model_type = json.load(open(os.path.join(folder, "config.json"))).get("model_type")
    from_h5 = app_run(build, "transformer", ["train.steps=1", f"model.init_from={ckpt}"], os.path.join(d, "h5.log"))
    from_st = app_run(build, "transformer", ["train.steps=1", f"model.init_from={folder}"], os.path.join(d, "st.log"))
    ok = model_type == "fsdp_transformer" and from_h5[1] == from_st[1]
    R.check("out transformer", ok, f"model_type {model_type}, first-step loss from the checkpoint {from_h5[1]!r}, "
            f"from the exported folder {from_st[1]!r} (bitwise equal expected)")
    if not ok:
        fails.append(f"transformer export: model_type {model_type}, losses {from_h5[1]!r} vs {from_st[1]!r}")


def in_direction(build, py, out, pairs, cfg, dtype, fails):
    d = os.path.join(out, f"in_{cfg}_{dtype}")
    os.makedirs(d)
    folder = os.path.join(d, "hf")
    theirs = hf(py, ["save", "--config", cfg, "--out", folder, "--dtype", dtype, "--max-shard-size", "200KB",
                     "--data", pairs, "--batch-index", "0"], os.path.join(d, "hf_save.log"))
    shards = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if "model.safetensors.index.json" not in os.listdir(folder) or len(shards) < 2:
        raise Fail(f"{folder}: save_pretrained wrote {sorted(os.listdir(folder))}, not the sharded index form")
    ours = app_run(build, cfg, [f"data.path={pairs}", "train.steps=1", f"model.init_from={folder}"],
                   os.path.join(d, "init.log"))
    check(fails, f"in {cfg} {dtype} ({len(shards)} shards): first-step loss from save_pretrained's folder", ours[1],
          theirs["loss"])
    return folder, shards


def damaged(build, out, folder, shards, cfg, pairs, fails):
    d = os.path.join(out, "damaged")
    shutil.copytree(folder, d)
    victim = os.path.join(d, shards[-1])
    os.truncate(victim, os.path.getsize(victim) - 10)
    log = os.path.join(d, "app.log")
    with open(log, "w") as f:
        r = subprocess.run(["timeout", "120"] + MPIRUN + [os.path.join(build, "apps", "fsdp_app"),
                                                          os.path.join(HERE, f"t5_{cfg}.yaml"), "--set",
                                                          f"data.path={pairs}", "--set", f"model.init_from={d}"],
                           stdout=subprocess.DEVNULL, stderr=f, timeout=150)
    lines = [line for line in open(log).read().splitlines() if line.startswith("fsdp_app:")]
    want = f"{victim}: tensor "
    ok = r.returncode == 1 and len(lines) == 1 and want in lines[0] and "runs past the end of the data" in lines[0]
    R.check("damaged shard", ok, f"exit {r.returncode}, {lines}")
    if not ok:
        fails.append(f"a shard cut short: exit {r.returncode}, lines {lines} (log {log})")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    build, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.environ.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    t0 = time.time()
    fails = []
    try:
        py = hf_python()
        pairs = os.path.join(out, "pairs.jsonl")
        run([PYTHON, os.path.join(HERE, "t5_pairs.py"), pairs], os.path.join(out, "pairs.log"))
        for cfg in ("v1_0", "v1_1"):
            out_direction(build, py, out, pairs, cfg, fails)
        transformer(build, out, fails)
        in_direction(build, py, out, pairs, "v1_0", "f32", fails)
        folder, shards = in_direction(build, py, out, pairs, "v1_1", "bf16", fails)
        damaged(build, out, folder, shards, "v1_1", pairs, fails)
    except Fail as e:
        R.check("hf_io", False, str(e))
        fails.append(str(e))
    R.print_counts()
    if fails:
        print(f"check_hf_io: FAIL: {'; '.join(fails)}")
        sys.exit(1)
    print(f"check_hf_io: PASS ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
