#!/usr/bin/python3
"""fsdp_ckpt as a user meets it, on checkpoints fsdp_app writes.

fsdp_app trains the same run twice (deterministic), once per checkpoint format, so the step-6
files hold the same state: consolidating the sharded one under mpirun -np 1, 3 and 4 must give
the consolidated one's /model and /optim bit for bit. Also: every crc32 attribute is zlib's
CRC-32 of the f32 bytes; verify passes good files and names the dataset after one flipped byte;
inspect shows shapes and step; reshard round trips are bitwise and fsdp_app resumes from their
output; bad arguments and bad files give one line on stderr and a non-zero exit.

usage: tool_tests.py FSDP_APP FSDP_CKPT      (Debian's /usr/bin/python3 with h5py, numpy)
Prints one PASS/FAIL line per check and the counts (pylib/report.py); exits 1 when any failed."""
import os, re, shutil, subprocess, sys, tempfile, time, zlib

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: pylib
from pylib import launch  # noqa: E402
from pylib.report import Report  # noqa: E402

APP, CKPT = (os.path.abspath(p) for p in sys.argv[1:3])
INPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "input", "fashion_mnist.yaml")
ENV = dict(launch.ENV)
# As tests/mpirun.sh: containers without ptrace rights break the shared-memory single copy.
ENV.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
TIMEOUT = 120
TMP = tempfile.mkdtemp(prefix="fsdp_ckpt_test_")
R = Report()


def check(name, ok, detail=""):
    """A PASS line, or a FAIL line with the detail's last 600 characters."""
    return R.check(name, ok, "" if ok or not detail else str(detail)[-600:])


def run(args, np_=None):
    cmd = ["timeout", "--kill-after=10", str(TIMEOUT)] + (launch.mpirun(np_) if np_ else [])
    return subprocess.run(cmd + [str(a) for a in args], env=ENV, capture_output=True, text=True)


def ckpt(*args, np_=None):
    return run([CKPT, *args], np_)


def train(tag, np_, sets):
    """fsdp_app on the fashion_mnist input with synthetic data; returns the checkpoint dir."""
    d = f"{TMP}/{tag}"
    sets = ["data.kind=synthetic", "train.eval_every=never", f"checkpoint.dir={d}",
            f"output.metrics={TMP}/{tag}.jsonl", "output.log_every=1000", *sets]
    args = [APP, INPUT]
    for s in sets:
        args += ["--set", s]
    p = run(args, np_)
    if p.returncode != 0:
        raise RuntimeError(f"fsdp_app {tag} exit {p.returncode}: {p.stderr.strip()[-600:]}")
    return d


def tensors(path, groups=("model", "optim")):
    """{dataset path: f32 bytes} under the given groups."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.split("/")[0] in groups:
                out[name] = (obj.dtype.str, obj.shape, np.asarray(obj).tobytes())
        f.visititems(visit)
    return out


def same_tensors(a, b, groups=("model", "optim")):
    ta, tb = tensors(a, groups), tensors(b, groups)
    if ta.keys() != tb.keys():
        return False, f"datasets differ: {sorted(ta.keys() ^ tb.keys())[:5]}"
    bad = [k for k in ta if ta[k] != tb[k]]
    return not bad and len(ta) > 0, f"{len(bad)} of {len(ta)} differ, e.g. {bad[:3]}"


def crc_problems(path):
    """Every crc32 attribute against zlib, and a sharded index's rows against their ranges."""
    bad, n = [], 0
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            nonlocal n
            if isinstance(obj, h5py.Dataset) and "crc32" in obj.attrs:
                n += 1
                if int(obj.attrs["crc32"]) != zlib.crc32(np.asarray(obj).astype("<f4").tobytes()):
                    bad.append(name)
        f.visititems(visit)
        if f.attrs.get("format") == "sharded":
            states = [s if isinstance(s, str) else s.decode() for s in f.attrs["optimizer_states"]]
            idx = f["index"]
            for row, name in enumerate(idx["names"][:]):
                unit, off, numel = (int(idx[k][row]) for k in ("unit", "offset", "numel"))
                for s, ds in enumerate(["params"] + [f"optim/{x}" for x in states]):
                    n += 1
                    data = np.asarray(f[f"shards/{unit}/{ds}"][off:off + numel]).astype("<f4").tobytes()
                    if int(idx["crc32"][row, s]) != zlib.crc32(data):
                        bad.append(f"{name.decode()} {ds}")
    return n, bad


def tensor_stats(path):
    """(tensor datasets, f32 bytes) as verify counts them: every dataset outside /index."""
    n, b = 0, 0
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            nonlocal n, b
            if isinstance(obj, h5py.Dataset) and not name.startswith("index/"):
                n, b = n + 1, b + obj.size * 4
        f.visititems(visit)
    return n, b


def flip_byte(src, dst, dataset, element):
    shutil.copy(src, dst)
    with h5py.File(dst, "r") as f:
        at = f[dataset].id.get_offset() + 4 * element + 1
    with open(dst, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0xFF]))


def one_error_line(p, mpi=False):
    """Exactly one line of ours on stderr and a failing exit. Under mpirun, mpirun adds its own
    banner about the exit status: ours is still one line, and no rank aborted the job."""
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    if mpi:
        lines = [l for l in lines if "fsdp_ckpt" in l] if "MPI_ABORT" not in p.stderr else lines + ["MPI_ABORT"]
    return p.returncode not in (0, 124, 137) and len(lines) == 1 and lines[0].startswith("fsdp_ckpt: ")


def main():
    t0 = time.time()
    # The same run twice, once per format: training is deterministic, so the states match.
    mnist = ["train.steps=6", "train.epochs=0"]
    sharded = train("sharded", 4, mnist + ["checkpoint.format=sharded"]) + "/ckpt_00000006.h5"
    consolidated = train("consolidated", 4, mnist + ["checkpoint.format=consolidated"]) + "/ckpt_00000006.h5"
    # A transformer with AdamW (two other state names), HYBRID_SHARD 2x2 (replicas split writes).
    tf = ["model.kind=transformer", "model.vocab=64", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
          "model.d_ff=64", "model.seq_len=16", "data.synthetic_samples=256", "train.optimizer.kind=adamw",
          "train.optimizer.lr=0.003", "train.scheduler.kind=none", "fsdp.auto_wrap.policy=transformer_layer",
          "fsdp.sharding_strategy=HYBRID_SHARD", "fsdp.hybrid.shard_group_size=2", "train.global_batch_size=16",
          "train.steps=4", "train.epochs=0"]
    tf_sharded = train("tf_sharded", 4, tf + ["checkpoint.format=sharded"]) + "/ckpt_00000004.h5"
    tf_consolidated = train("tf_consolidated", 4, tf + ["checkpoint.format=consolidated"]) + "/ckpt_00000004.h5"
    # bf16 parameters: output.save_weights writes the f32 master weights, the checkpoint's /model
    # bit for bit (PyTorch's full state dict under MixedPrecision), not the bf16 compute copy.
    bf16_weights = f"{TMP}/bf16_weights.h5"
    bf16_ckpt = train("tf_bf16", 2, tf[:-5] + ["fsdp.sharding_strategy=FULL_SHARD", "train.global_batch_size=16",
                                               "train.steps=4", "train.epochs=0", "checkpoint.format=consolidated",
                                               "fsdp.mixed_precision.param_dtype=bf16",
                                               f"output.save_weights={bf16_weights}"]) + "/ckpt_00000004.h5"
    print(f"# checkpoints written in {time.time() - t0:.1f} s under {TMP}", flush=True)
    ok, detail = same_tensors(bf16_weights, bf16_ckpt, ("model",))
    with h5py.File(bf16_weights, "r") as f:
        values = np.concatenate([np.asarray(f["model"][k], dtype="<f4").ravel() for k in f["model"]])
    off_bf16 = int(np.count_nonzero(values.view(np.uint32) & 0xFFFF))  # low bits a bf16 value has as zeros
    check("save_weights of a bf16-parameter run: the checkpoint's f32 master weights bitwise, not bf16 values",
          ok and off_bf16 > values.size // 2, f"{detail}; {off_bf16} of {values.size} not bf16 values")

    for path in (sharded, consolidated, tf_sharded, tf_consolidated):
        n, bad = crc_problems(path)
        check(f"crc32 attributes = zlib.crc32 of the f32 bytes ({n} in {os.path.relpath(path, TMP)})", n > 0 and not bad, bad)

    # inspect
    with h5py.File(consolidated, "r") as f:
        shapes = {k: f["model"][k].shape for k in f["model"]}
    for path, fmt in ((sharded, "sharded"), (consolidated, "consolidated")):
        p = ckpt("inspect", path)
        out = p.stdout
        missing = [k for k, s in shapes.items() if "[" + ", ".join(map(str, s)) + "]" not in out]
        ok = (p.returncode == 0 and f"fsdp-hpc checkpoint, {fmt} format, step 6" in out
              and re.search(r"^\s+step\s+6$", out, re.M) and re.search(r"^\s+world_size\s+4$", out, re.M)
              and re.search(r"^\s+optimizer_states\s+\[square_avg, acc_delta\]$", out, re.M)
              and re.search(r"^    model:$", out, re.M) and not missing)
        check(f"inspect {fmt}: step, attributes, config_yaml text and every shape", ok, p.stderr or missing or out[:400])
    p = ckpt("inspect", sharded)
    index = p.stdout.split("index:", 1)[-1]
    rows = [l for l in index.splitlines() if re.match(r"^\s+fc1\.weight\s+\d+\s+0\s+1179648\s+\[128, 9216\]$", l)]
    check("inspect sharded: index table row (name, unit, offset, numel, shape)", len(rows) == 1, index[:400])
    ds_row = re.search(r"^\s+/shards/\d+/params\s+\[\d+\]\s+f32\s+\d+\s+\d+$", p.stdout, re.M)
    check("inspect sharded: dataset rows with shape, dtype, bytes, crc32", ds_row, p.stdout[:400])

    foreign = f"{TMP}/foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["weights/w"] = np.arange(6, dtype="<f8").reshape(2, 3)
        f.attrs["note"] = "made by h5py"
    p = ckpt("inspect", foreign)
    check("inspect foreign HDF5 file: tree and 'not an fsdp-hpc checkpoint'",
          p.returncode == 0 and "not an fsdp-hpc checkpoint" in p.stdout
          and re.search(r"/weights/w\s+\[2, 3\]\s+f64\s+48", p.stdout) and "made by h5py" in p.stdout, p.stdout + p.stderr)

    # verify: good files
    for path in (sharded, consolidated, tf_sharded, tf_consolidated):
        n, b = tensor_stats(path)
        p = ckpt("verify", path)
        check(f"verify good {os.path.relpath(path, TMP)}: OK: {n} datasets, {b} bytes",
              p.returncode == 0 and p.stdout.strip() == f"OK: {n} datasets, {b} bytes verified", p.stdout + p.stderr)

    p = ckpt("verify", sharded, np_=2)
    check("verify under mpirun -np 2: rank 0 alone prints", p.returncode == 0 and p.stdout.count("OK: ") == 1,
          p.stdout + p.stderr)

    # verify: one flipped byte inside a tensor's data
    bad_c = f"{TMP}/bad_consolidated.h5"
    flip_byte(consolidated, bad_c, "model/fc1.weight", 500000)
    p = ckpt("verify", bad_c)
    named = [l for l in p.stdout.splitlines() if not l.startswith("FAILED: ")]
    check("verify flipped byte (consolidated): exit 1, the line names /model/fc1.weight",
          p.returncode == 1 and len(named) == 1 and "/model/fc1.weight" in named[0], p.stdout + p.stderr)
    with h5py.File(sharded, "r") as f:
        row = [n.decode() for n in f["index/names"][:]].index("fc1.weight")
        unit, off = int(f["index/unit"][row]), int(f["index/offset"][row])
    bad_s = f"{TMP}/bad_sharded.h5"
    flip_byte(sharded, bad_s, f"shards/{unit}/optim/square_avg", off + 1000)
    p = ckpt("verify", bad_s)
    lines = [l for l in p.stdout.splitlines() if not l.startswith("FAILED: ")]
    check("verify flipped byte (sharded): exit 1, names the shard dataset and fc1.weight (square_avg)",
          p.returncode == 1 and len(lines) == 2 and any(f"/shards/{unit}/optim/square_avg: crc32" in l for l in lines)
          and any(l.startswith("fc1.weight (square_avg): crc32 mismatch") for l in lines), p.stdout + p.stderr)

    truncated = f"{TMP}/truncated.h5"
    with open(sharded, "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(os.path.getsize(sharded) // 2))
    for what, path in (("truncated", truncated), ("foreign", foreign), ("missing", f"{TMP}/nope.h5"),
                       ("non-HDF5", INPUT)):
        p = ckpt("verify", path)
        check(f"verify {what} file: one line on stderr, exit 1", one_error_line(p) and p.returncode == 1,
              f"rc {p.returncode} " + p.stderr)

    # consolidate at several world sizes = fsdp_app's consolidated file, bit for bit
    for np_ in (1, 3, 4):
        out = f"{TMP}/consolidated_np{np_}.h5"
        p = ckpt("consolidate", sharded, out, np_=np_)
        ok, detail, attrs_ok = False, p.stderr, False
        if p.returncode == 0:
            ok, detail = same_tensors(out, consolidated)
            with h5py.File(out, "r") as f:
                attrs_ok = f.attrs["format"] == "consolidated" and int(f.attrs["step"]) == 6
        check(f"consolidate -np {np_}: /model and /optim bitwise equal to fsdp_app's consolidated file",
              ok and attrs_ok and len(p.stdout.splitlines()) == 1, detail)
    out = f"{TMP}/tf_consolidated_np3.h5"
    p = ckpt("consolidate", tf_sharded, out, np_=3)
    ok, detail = same_tensors(out, tf_consolidated) if p.returncode == 0 else (False, p.stderr)
    check("consolidate -np 3 (transformer, AdamW, HYBRID_SHARD file): bitwise equal", ok, detail)
    n, bad = crc_problems(f"{TMP}/consolidated_np3.h5")
    check("consolidate output: crc32 attributes = zlib.crc32", n > 0 and not bad, bad)

    # reshard round trips
    mid, back = f"{TMP}/rs_sharded.h5", f"{TMP}/rs_back.h5"
    p1 = ckpt("reshard", consolidated, mid, "--format", "sharded", np_=3)
    p2 = ckpt("reshard", mid, back, "--format=consolidated", np_=2)
    ok, detail = same_tensors(back, consolidated) if p1.returncode == 0 and p2.returncode == 0 else (False, p1.stderr + p2.stderr)
    check("reshard consolidated -> sharded (-np 3) -> consolidated (-np 2): bitwise", ok, detail)
    if p1.returncode == 0:
        with h5py.File(mid, "r") as f:
            units = len(f["index/unit_padded_numel"])
        check("reshard consolidated -> sharded: one unit per parameter", units == len(shapes), units)
        n, bad = crc_problems(mid)
        check("reshard sharded output: crc32 attributes and index = zlib.crc32", n > 0 and not bad, bad)
        p = ckpt("verify", mid)
        check("verify reshard's sharded output", p.returncode == 0 and p.stdout.startswith("OK: "), p.stdout + p.stderr)
    same = f"{TMP}/rs_same.h5"
    p = ckpt("reshard", sharded, same, np_=3)
    ok, detail = same_tensors(same, sharded, ("shards", "index")) if p.returncode == 0 else (False, p.stderr)
    check("reshard sharded -> sharded (-np 3): units, padding and index bitwise unchanged", ok, detail)

    # fsdp_app resumes from the converted file exactly as from its own
    if p1.returncode == 0:
        weights = {}
        for tag, path in (("orig", consolidated), ("resharded", mid)):
            w = f"{TMP}/resume_{tag}.h5"
            args = [APP, INPUT]
            for s in ["data.kind=synthetic", "train.eval_every=never", "train.steps=8", "train.epochs=0",
                      f"checkpoint.resume={path}", f"output.metrics={TMP}/resume_{tag}.jsonl", f"output.save_weights={w}",
                      "fsdp.auto_wrap.policy=size_based", "fsdp.auto_wrap.min_num_params=1000"]:
                args += ["--set", s]
            p = run(args, 2)
            weights[tag] = w if p.returncode == 0 and "resumed from" in p.stdout else None
            if weights[tag] is None:
                print(p.stdout[-400:] + p.stderr[-400:])
        ok, detail = same_tensors(weights["orig"], weights["resharded"], ("model",)) if all(weights.values()) else (False, "a run failed")
        check("fsdp_app (-np 2, other wrap policy) resumes from reshard's file exactly as from its own", ok, detail)

    # consolidate fails cleanly under mpirun on a damaged file: one line, no output file
    out = f"{TMP}/from_bad.h5"
    p = ckpt("consolidate", bad_s, out, np_=3)
    check("consolidate -np 3 of a damaged file: one line naming the crc32 failure, exit != 0, no output",
          one_error_line(p, mpi=True) and "crc32" in p.stderr and not os.path.exists(out)
          and not os.path.exists(out + ".tmp"), f"rc {p.returncode} " + p.stderr)
    p = ckpt("consolidate", foreign, out, np_=2)
    check("consolidate -np 2 of a foreign file: one line, exit != 0", one_error_line(p, mpi=True) and not os.path.exists(out),
          f"rc {p.returncode} " + p.stderr)

    # OUT protection
    existing = f"{TMP}/consolidated_np1.h5"
    p = ckpt("consolidate", sharded, existing)
    check("consolidate onto an existing file without --force: one line, exit 1", one_error_line(p), p.stderr)
    p = ckpt("consolidate", sharded, existing, "--force")
    check("consolidate --force replaces it", p.returncode == 0 and same_tensors(existing, consolidated)[0], p.stderr)

    # bad arguments
    for args in ([], ["frobnicate"], ["inspect"], ["inspect", f"{TMP}/nope.h5"], ["verify", "a", "b"],
                 ["consolidate", sharded], ["consolidate", f"{TMP}/nope.h5", f"{TMP}/x.h5"],
                 ["consolidate", sharded, f"{TMP}/no/such/dir/x.h5"], ["reshard", sharded, f"{TMP}/x.h5", "--format", "zip"],
                 ["reshard", sharded, f"{TMP}/x.h5", "--format"], ["verify", sharded, "--bogus"],
                 ["inspect", sharded, "--format", "sharded"]):
        p = ckpt(*args)
        check(f"bad arguments {' '.join(os.path.basename(a) for a in args) or '(none)'}: one line on stderr, exit != 0",
              one_error_line(p) and p.stdout == "", f"rc {p.returncode} stdout {p.stdout[:100]!r} stderr {p.stderr!r}")
    p = ckpt("--help")
    check("--help: usage on stdout, exit 0, says fsdp_app loads any checkpoint itself",
          p.returncode == 0 and "Usage: fsdp_ckpt" in p.stdout and "fsdp_app itself loads" in p.stdout, p.stderr)

    R.print_counts()
    if not R.failed:
        shutil.rmtree(TMP, ignore_errors=True)
    return R.exit_code()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a setup failure is a failed test, not a traceback only
        R.check("setup", False, str(e))
        R.print_counts()
        sys.exit(1)
