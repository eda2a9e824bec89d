#!/usr/bin/python3
"""Bad checkpoints: each kind of damaged or foreign file given to checkpoint.resume=PATH (and the
relevant ones to model.init_from) must end fsdp_app with a non-zero exit code below 128, exactly
one error line from fsdp_app on stderr naming the file and the problem, no crash and no hang, at
np=1 (the app alone) and np=3 (mpirun). resume=auto over a folder of garbage ckpt_*.h5 files
skips them with a note and starts fresh.

usage: corrupt_tests.py FSDP_APP        (Debian's /usr/bin/python3 with h5py, numpy)
Prints one PASS/FAIL line per check; exits non-zero on any failure."""
import os
import shutil
import sys
import zlib

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: pylib
from pylib.ckpt import ckpt_files, ckpt_name  # noqa: E402
from pylib.configs import MODELS  # noqa: E402
from pylib.harness import Harness  # noqa: E402

H = Harness(sys.argv[1], "fsdp_ckpt_corrupt_")
TIMEOUT = 60
CRASH = ["Segmentation", "core dumped", "terminate called", "Aborted", "free()", "malloc", "stack smashing",
         "HDF5-DIAG", "Traceback"]
TENSOR = "blocks.1.fc1.weight"  # (64, 32) in the tiny transformer


def sets(extra):
    return MODELS["transformer"] + ["train.steps=5"] + list(extra)


# ---------------------------------------------------------------------------------------------
# Good files to damage: the tiny transformer after 3 steps, adamw (and adadelta), both formats.

def make_good():
    good = {}
    for fmt, opt, np_ in [("consolidated", "adamw", 2), ("sharded", "adamw", 2), ("consolidated", "adadelta", 1)]:
        d = H.path(f"good_{fmt}_{opt}")
        extra = [f"checkpoint.dir={d}", f"checkpoint.format={fmt}", "train.stop_after_steps=3"]
        if opt == "adadelta":
            extra += ["train.optimizer.kind=adadelta", "train.optimizer.lr=1.0"]
        H.run_ok(np_, sets(extra))
        good[(fmt, opt)] = os.path.join(d, ckpt_name(3))
    return good


def copy_of(src, name):
    dst = H.path("bad", name)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def flip_byte(path, dataset, at=101):
    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_offset()
    with open(path, "r+b") as f:
        f.seek(offset + at)
        b = f.read(1)
        f.seek(offset + at)
        f.write(bytes([b[0] ^ 0x10]))


def replace_dataset(path, name, data):
    with h5py.File(path, "r+") as f:
        attrs = dict(f[name].attrs)
        del f[name]
        f[name] = data
        for k, v in attrs.items():
            f[name].attrs[k] = v
        if np.issubdtype(np.asarray(data).dtype, np.floating):
            f[name].attrs["crc32"] = np.int64(zlib.crc32(np.asarray(data).astype("<f4").tobytes()))


def build_cases(good):
    """(name, file, expected substring, via) for every bad file."""
    cons, shard, adadelta = good[("consolidated", "adamw")], good[("sharded", "adamw")], good[("consolidated", "adadelta")]
    cases = []

    def add(name, path, expect, via=("resume",)):
        cases.append((name, path, expect, via))

    p = H.path("bad", "empty.h5")
    os.makedirs(os.path.dirname(p), exist_ok=True)
    open(p, "w").close()
    add("empty file", p, "not an HDF5 file", ("resume", "init_from"))

    p = H.path("bad", "text.h5")
    with open(p, "w") as f:
        f.write("this is not a checkpoint\n" * 100)
    add("text file", p, "not an HDF5 file", ("resume", "init_from"))

    add("missing file", H.path("bad", "no_such_file.h5"), "cannot read the file", ("resume", "init_from"))

    for name, size in [("truncated to half", os.path.getsize(cons) // 2), ("truncated to 4 KiB", 4096)]:
        p = copy_of(cons, name.replace(" ", "_") + ".h5")
        os.truncate(p, size)
        add(name, p, "truncated", ("resume", "init_from"))
    p = copy_of(shard, "sharded_truncated.h5")
    os.truncate(p, os.path.getsize(p) * 2 // 3)
    add("sharded truncated to 2/3", p, "truncated")

    p = H.path("bad", "foreign.h5")
    with h5py.File(p, "w") as f:
        f["data"] = np.arange(10, dtype=np.float32)
    add("foreign HDF5 (no attributes)", p, "no format_version attribute")

    p = copy_of(cons, "version99.h5")
    with h5py.File(p, "r+") as f:
        f.attrs["format_version"] = np.int64(99)
    add("format_version 99", p, "format_version 99 is not supported")

    p = copy_of(cons, "format_zip.h5")
    with h5py.File(p, "r+") as f:
        f.attrs["format"] = "zip"
    add("unknown format attribute", p, "unknown format 'zip'")

    p = copy_of(cons, "missing_tensor.h5")
    with h5py.File(p, "r+") as f:
        del f[f"model/{TENSOR}"]
    add("missing tensor", p, f"missing tensor /model/{TENSOR}", ("resume", "init_from"))

    p = copy_of(cons, "misshaped.h5")
    with h5py.File(p, "r") as f:
        w = f[f"model/{TENSOR}"][()]
    replace_dataset(p, f"model/{TENSOR}", np.ascontiguousarray(w.T))
    add("mis-shaped tensor", p, f"/model/{TENSOR} has shape [32, 64], the model expects [64, 32]",
        ("resume", "init_from"))

    p = copy_of(cons, "int_tensor.h5")
    replace_dataset(p, f"model/{TENSOR}", (w * 1000).astype(np.int32))
    add("integer-typed tensor", p, "is not a floating-point dataset", ("resume", "init_from"))

    p = copy_of(cons, "flipped_byte.h5")
    flip_byte(p, f"model/{TENSOR}")
    add("flipped byte in a tensor", p, f"{TENSOR} fails its crc32 check")

    p = copy_of(cons, "flipped_byte_optim.h5")
    flip_byte(p, f"optim/{TENSOR}/exp_avg_sq", at=7)
    add("flipped byte in an optimizer state", p, f"{TENSOR} (exp_avg_sq) fails its crc32 check")

    p = copy_of(shard, "sharded_flipped_byte.h5")
    flip_byte(p, "shards/2/params", at=4 * 50 + 2)
    add("sharded: flipped byte", p, "fails its crc32 check")

    p = copy_of(shard, "sharded_oob_offset.h5")
    with h5py.File(p, "r+") as f:
        f["index/offset"][3] = 10 ** 9
    add("sharded: index offset out of bounds", p, "outside its unit's")

    p = copy_of(shard, "sharded_bad_unit.h5")
    with h5py.File(p, "r+") as f:
        f["index/unit"][0] = 77
    add("sharded: index unit out of range", p, "in unit 77 of")

    p = copy_of(shard, "sharded_missing_shard.h5")
    with h5py.File(p, "r+") as f:
        del f["shards/1/params"]
    add("sharded: missing shard dataset", p, "missing dataset /shards/1/params")

    p = copy_of(shard, "sharded_numel.h5")
    with h5py.File(p, "r+") as f:
        f["index/numel"][2] = f["index/numel"][2] + 1
    add("sharded: numel disagrees with shape", p, "numel")

    p = copy_of(shard, "sharded_no_index.h5")
    with h5py.File(p, "r+") as f:
        del f["index/offset"]
    add("sharded: index dataset missing", p, "sharded index /index/offset is missing")

    add("sharded file given to init_from", shard, "has no /model group", ("init_from",))

    p = copy_of(cons, "no_optim_state.h5")
    with h5py.File(p, "r+") as f:
        f.attrs["optimizer_states"] = [s for s in f.attrs["optimizer_states"] if s != "exp_avg"]
    add("missing optimizer state (attribute)", p, "has no optimizer state 'exp_avg'")

    p = copy_of(cons, "no_optim_dataset.h5")
    with h5py.File(p, "r+") as f:
        del f[f"optim/{TENSOR}/exp_avg_sq"]
    add("missing optimizer state (dataset)", p, f"missing tensor /optim/{TENSOR}/exp_avg_sq")

    add("written with another optimizer (adadelta)", adadelta, "written with optimizer adadelta, this run uses adamw")

    p = copy_of(cons, "extra_tensor.h5")
    with h5py.File(p, "r+") as f:
        f["model/extra.weight"] = np.zeros((3, 3), np.float32)
    add("extra tensor", p, "unexpected tensor /model/extra.weight", ("resume", "init_from"))

    p = copy_of(cons, "no_step.h5")
    with h5py.File(p, "r+") as f:
        del f.attrs["step"]
    add("missing step attribute", p, "attribute step is missing")

    p = copy_of(cons, "step_string.h5")
    with h5py.File(p, "r+") as f:
        f.attrs["step"] = "three"
    add("step attribute of the wrong type", p, "attribute step is not an integer")

    p = copy_of(cons, "negative_step.h5")
    with h5py.File(p, "r+") as f:
        f.attrs["step"] = np.int64(-4)
    add("negative step attribute", p, "negative step")

    p = copy_of(cons, "no_crc.h5")
    with h5py.File(p, "r+") as f:
        del f[f"model/{TENSOR}"].attrs["crc32"]
    add("tensor without crc32 attribute", p, "attribute crc32 is missing")

    add("a folder", H.path("bad"), "checkpoint", ("resume",))
    return cases


def check_case(name, path, expect, via, np_):
    key = "checkpoint.resume" if via == "resume" else "model.init_from"
    r = H.run(np_, sets([f"{key}={path}"]), timeout=TIMEOUT, mpirun=np_ > 1)
    ours = r.ours()
    line = ours[0] if len(ours) == 1 else " | ".join(ours)
    crashed = [c for c in CRASH if c in r.err or c in r.out]
    problems = []
    if r.rc == 0:
        problems.append("exit 0")
    if r.rc == 124 or r.seconds >= TIMEOUT:
        problems.append("hung until the timeout")
    elif r.rc >= 128:
        problems.append(f"killed by a signal (exit {r.rc})")
    if crashed:
        problems.append(f"crash text {crashed}")
    if len(ours) != 1:
        problems.append(f"{len(ours)} fsdp_app lines on stderr")
    if np_ == 1 and len(r.err.strip().splitlines()) != 1:
        problems.append(f"stderr has {len(r.err.strip().splitlines())} lines")
    if expect not in line:
        problems.append(f"lacks '{expect}'")
    if via == "resume" and os.path.basename(path) not in line:
        problems.append("does not name the file")
    if "MPI_ABORT" in r.err:
        problems.append("MPI_ABORT")
    H.check(f"{name} via {key} np={np_}", not problems,
            f"exit {r.rc} in {r.seconds:.1f} s: {line.strip()[:300] or r.tail(300)}"
            + (f"  <- {'; '.join(problems)}" if problems else ""))


def garbage_folder(d, good):
    os.makedirs(d)
    with open(os.path.join(d, ckpt_name(2)), "w") as f:
        f.write("garbage\n")
    open(os.path.join(d, ckpt_name(4)), "w").close()
    shutil.copyfile(good, os.path.join(d, ckpt_name(6)))
    os.truncate(os.path.join(d, ckpt_name(6)), 4096)
    shutil.copyfile(good, os.path.join(d, ckpt_name(7)))  # a complete file under another step's name
    with h5py.File(os.path.join(d, ckpt_name(8)), "w") as f:
        f["x"] = np.zeros(4, np.float32)
    shutil.copyfile(good, os.path.join(d, "ckpt_00000009.h5.tmp"))  # a .tmp is never a candidate
    return ckpt_files(d)


def garbage_folder_case():
    """resume=auto skips every ckpt_*.h5 that is not a complete checkpoint and starts fresh."""
    good = H.path("good_consolidated_adamw", ckpt_name(3))
    for np_ in [1, 3]:
        d = H.path(f"garbage_np{np_}")
        garbage = garbage_folder(d, good)
        r = H.run(np_, sets([f"checkpoint.dir={d}", "checkpoint.resume=auto", "train.stop_after_steps=1"]),
                  timeout=TIMEOUT, mpirun=np_ > 1)
        skips = [l for l in r.out.splitlines() if l.startswith("checkpoint: skipping")]
        fresh = "starting fresh" in r.out and "resumed from" not in r.out
        H.check(f"resume=auto over garbage only np={np_}: skips every file and starts fresh",
                r.rc == 0 and len(skips) == 5 and fresh,
                f"exit {r.rc}, {len(skips)} skipping notes for {garbage}, "
                f"{'started fresh' if fresh else 'did NOT start fresh'}"
                + ("" if r.rc == 0 else f": {r.tail(300)}") + f"; e.g. '{skips[0] if skips else ''}'")
        files = ckpt_files(d)
        # The run's own checkpoint (step 1) must survive the pruning that follows its save: the
        # next resume=auto would otherwise start from scratch again.
        H.check(f"resume=auto over garbage only np={np_}: the fresh run's checkpoint is kept", ckpt_name(1) in files,
                f"folder after the run: {files}")


def main():
    good = {}

    def setup():
        good.update(make_good())
        H.check("good checkpoints written", len(good) == 3, ", ".join(os.path.basename(os.path.dirname(p)) for p in
                                                                        good.values()))
    H.case("setup", setup)
    if len(good) != 3:
        H.finish()
    cases = build_cases(good)
    print(f"{len(cases)} kinds of bad file", flush=True)
    for name, path, expect, vias in cases:
        for via in vias:
            for np_ in [1, 3]:
                H.case(f"{name} {via} np={np_}", check_case, name, path, expect, via, np_)
    H.case("garbage folder", garbage_folder_case)
    H.finish()


if __name__ == "__main__":
    main()
