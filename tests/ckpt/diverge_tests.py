#!/usr/bin/python3
"""A diverged run must not eat the good checkpoints, at np 1 and 3 (mnist_cnn, synthetic data):

  diverge        6 steps with checkpoint.every_steps=2, keep=2 (files of steps 4 and 6), then a
                 resume with train.optimizer.lr=1e30: the run stops with exit 1 and one line
                 "fsdp_app: step 8: the loss is nan; the run diverged and stops (last good
                 checkpoint: .../ckpt_00000006.h5)"; the step-4 and step-6 files are still
                 there, byte for byte, and no later file or .tmp was left. (A state holding
                 NaN/Inf that reaches a save is refused by save_checkpoint itself: test_ckpt.)
  skip_nonfinite a checkpoint holding a NaN (written here with h5py, its crc32 updated: a sound
                 file) as the newest: resume auto passes over it with a note and resumes from
                 the one before; resume: THAT_FILE is one error line naming it.
  all_nonfinite  a folder whose only checkpoint holds an Inf: resume auto refuses to start
                 (the shards would hold that file's values), one line, exit 1.

usage: diverge_tests.py FSDP_APP   (Debian's /usr/bin/python3 with h5py, numpy)"""
import hashlib
import os
import shutil
import sys
import zlib

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: pylib
from pylib.ckpt import ckpt_name  # noqa: E402
from pylib.configs import CNN  # noqa: E402
from pylib.harness import Harness  # noqa: E402

H = Harness(sys.argv[1], "fsdp_ckpt_diverge_")


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def files(d):
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def poison(src, dst, step, value):
    """dst: src with one weight set to `value`, claiming step `step`; every CRC still right."""
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        ds = f["model/fc1.weight"]
        v = ds[...]
        v[3, 7] = value
        ds[...] = v
        ds.attrs["crc32"] = np.uint32(zlib.crc32(np.ascontiguousarray(v, dtype="<f4").tobytes()))
        f.attrs["step"] = step
        f.attrs["step_in_epoch"] = step % int(f.attrs["steps_per_epoch"])
        f.attrs["epoch"] = step // int(f.attrs["steps_per_epoch"])


def one_line(r, needle):
    """The app's own stderr lines: exactly one, holding `needle`."""
    ours = r.ours()
    return len(ours) == 1 and needle in ours[0], ours


def folder(case, np_, keep):
    """A checkpoint folder of its own and the settings that save into it every 2 steps."""
    ck = H.path(f"{case}_np{np_}", "ck")
    return ck, CNN + [f"checkpoint.dir={ck}", "checkpoint.every_steps=2", f"checkpoint.keep={keep}"]


def diverge(np_):
    ck, base = folder("diverge", np_, 2)
    H.run_ok(np_, base + ["train.steps=6"])
    good = {n: digest(os.path.join(ck, n)) for n in files(ck)}
    H.check(f"diverge np={np_}: the good run kept steps 4 and 6", sorted(good) == [ckpt_name(4), ckpt_name(6)],
            f"{sorted(good)}")
    # Step 7's update (lr 1e30) leaves huge weights; step 8's forward overflows to a NaN loss (NaN
    # propagates through relu and max-pool as in PyTorch), caught before the optimizer step.
    r = H.run(np_, base + ["train.steps=20", "checkpoint.resume=auto", "train.optimizer.lr=1e30"])
    last_good = os.path.join(ck, ckpt_name(6))
    ok, ours = one_line(r, f"fsdp_app: step 8: the loss is nan; the run diverged and stops (last good checkpoint: "
                           f"{last_good})")
    H.check(f"diverge np={np_}: exit 1 and one line naming the step and {ckpt_name(6)}", r.rc == 1 and ok,
            f"rc {r.rc}, lines {ours}")
    after = {n: digest(os.path.join(ck, n)) for n in files(ck)}
    H.check(f"diverge np={np_}: steps 4 and 6 untouched, nothing else written", after == good,
            f"before {sorted(good)}, after {sorted(after)}")


def skip_nonfinite(np_):
    ck, base = folder("skip", np_, 3)
    H.run_ok(np_, base + ["train.steps=4"])
    bad = os.path.join(ck, ckpt_name(6))
    poison(os.path.join(ck, ckpt_name(4)), bad, 6, np.nan)
    r = H.run_ok(np_, base + ["train.steps=6", "checkpoint.resume=auto"])
    four = os.path.join(ck, ckpt_name(4))
    H.check(f"skip_nonfinite np={np_}: resume auto passes over the NaN file with a note",
            f"checkpoint: skipping checkpoint {bad}: fc1.weight holds non-finite values" in r.out and
            f"resumed from {four} at step 4" in r.out, r.out[-600:])
    poison(four, bad, 6, np.nan)  # the run above replaced it with a good step-6 file
    r = H.run(np_, base + ["train.steps=8", f"checkpoint.resume={bad}"])
    ok, ours = one_line(r, f"checkpoint {bad}: fc1.weight holds non-finite values")
    H.check(f"skip_nonfinite np={np_}: resume: THE_FILE is one error line, exit 1", r.rc == 1 and ok,
            f"rc {r.rc}, lines {ours}")


def all_nonfinite(np_):
    ck, base = folder("all", np_, 1)
    H.run_ok(np_, base + ["train.steps=2"])
    two = os.path.join(ck, ckpt_name(2))
    poison(two, two + ".x", 2, np.inf)
    os.replace(two + ".x", two)
    r = H.run(np_, base + ["train.steps=4", "checkpoint.resume=auto"])
    ok, ours = one_line(r, f"checkpoint.resume auto: every checkpoint in {ck} holds non-finite values")
    H.check(f"all_nonfinite np={np_}: refuses to start, one line, exit 1", r.rc == 1 and ok, f"rc {r.rc}, lines {ours}")
    H.check(f"all_nonfinite np={np_}: the file is left as it was", files(ck) == [ckpt_name(2)], f"{files(ck)}")


for n in (1, 3):
    H.case(f"diverge np={n}", diverge, n)
    H.case(f"skip_nonfinite np={n}", skip_nonfinite, n)
    H.case(f"all_nonfinite np={n}", all_nonfinite, n)
H.finish()
