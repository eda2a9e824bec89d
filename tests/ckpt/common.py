"""Shared helpers for the checkpoint tests (tests/ckpt/*.py): launching fsdp_app under mpirun,
reading its metrics and checkpoint files, and counting PASS/FAIL lines.

Run the scripts with Debian's /usr/bin/python3 (h5py, numpy, torch)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import h5py
import numpy as np

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
ENV.pop("FSDP_TEST_KILL_RANK_DURING_SAVE", None)

# A tiny decoder LM on synthetic tokens (4 units: 3 blocks + root) and the MNIST example CNN on
# synthetic images (5 units). 480 train samples, global batch 120: 4 steps per epoch, and 120
# splits evenly over 1, 2, 3, 4, 5 and 8 ranks.
GLOBAL_BATCH = 120
COMMON = ["data.kind=synthetic", "data.synthetic_samples=480", f"train.global_batch_size={GLOBAL_BATCH}",
          "train.epochs=0", "train.eval_every=never", "train.shuffle=true", "train.threads=1", "output.log_every=1000",
          "train.dropout=false"]
TRANSFORMER = ["model.kind=transformer", "model.vocab=64", "model.d_model=32", "model.n_layers=3", "model.n_heads=4",
               "model.d_ff=64", "model.seq_len=16", "train.optimizer.kind=adamw", "train.optimizer.lr=0.003",
               "train.scheduler.kind=cosine", "train.scheduler.warmup_steps=3", "train.clip_grad_norm=1.0",
               "fsdp.auto_wrap.policy=transformer_layer"] + COMMON
CNN = ["model.kind=mnist_cnn", "train.optimizer.kind=adadelta", "train.optimizer.lr=1.0", "train.scheduler.kind=step",
       "train.scheduler.step_size=1", "train.scheduler.gamma=0.7", "fsdp.auto_wrap.policy=size_based",
       "fsdp.auto_wrap.min_num_params=100"] + COMMON
# T5 (v1.0: lm_head tied to the shared embedding) on synthetic byte pairs, its blocks as units.
T5 = ["model.kind=t5", "model.vocab_size=259", "model.d_model=32", "model.d_kv=8", "model.num_heads=4",
      "model.d_ff=48", "model.num_layers=2", "model.num_decoder_layers=2", "model.dropout_rate=0.1",
      "data.source_len=12", "data.target_len=8", "train.optimizer.kind=adamw", "train.optimizer.lr=0.003",
      "train.clip_grad_norm=1.0", "fsdp.auto_wrap.policy=transformer_layer"] + COMMON
MODELS = {"transformer": TRANSFORMER, "mnist_cnn": CNN, "t5": T5}


class Result:
    def __init__(self, rc, out, err, seconds, cmd):
        self.rc, self.out, self.err, self.seconds, self.cmd = rc, out, err, seconds, cmd

    def tail(self, n=600):
        ours = self.ours()
        return "\n".join(ours)[-n:] if ours else (self.err.strip() or self.out.strip())[-n:]

    def ours(self):
        """stderr lines written by fsdp_app itself (mpirun adds its own banner on failures)."""
        return [l for l in self.err.splitlines() if l.startswith("fsdp_app:")]


class Harness:
    def __init__(self, app, prefix):
        self.app = os.path.abspath(app)
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.cfg = os.path.join(self.tmp, "empty.yaml")
        open(self.cfg, "w").close()
        self.passed = self.failed = 0
        self.t0 = time.time()

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def command(self, np_, sets, timeout=120, mpirun=True):
        """np_ ranks under mpirun (mpirun=False: np_ must be 1, the app alone)."""
        cmd = ["timeout", "-k", "10", str(timeout)]
        if mpirun:
            cmd += ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
        else:
            assert np_ == 1
        cmd += [self.app, self.cfg]
        for s in sets:
            cmd += ["--set", s]
        return cmd

    def run(self, np_, sets, env=None, timeout=120, mpirun=True):
        cmd = self.command(np_, sets, timeout, mpirun)
        t0 = time.time()
        p = subprocess.run(cmd, env=dict(ENV, **(env or {})), capture_output=True, text=True, cwd=self.tmp)
        return Result(p.returncode, p.stdout, p.stderr, time.time() - t0, cmd)

    def run_ok(self, np_, sets, **kw):
        r = self.run(np_, sets, **kw)
        if r.rc != 0:
            raise RuntimeError(f"np={np_} exit {r.rc}: {r.tail()}")
        return r

    def check(self, name, ok, detail=""):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def case(self, name, fn, *args):
        """Runs one test case; an exception in it is a FAIL line with the reason. CKPT_TEST_ONLY=text
        runs only the cases whose name contains text (when iterating on one)."""
        only = os.environ.get("CKPT_TEST_ONLY")
        if only and only not in name:
            return
        t0 = time.time()
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - any error is this case's failure
            self.check(name, False, f"error: {e}")
            traceback.print_exc(limit=3, file=sys.stdout)
        print(f"      ({name}: {time.time() - t0:.1f} s)", flush=True)

    def finish(self):
        total = self.passed + self.failed
        print(f"  {self.passed} check{'s' if self.passed != 1 else ''} out of {total} passed, {self.failed} failed "
              f"({time.time() - self.t0:.0f} s)", flush=True)
        if not self.failed:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            print(f"  files kept in {self.tmp}")
        sys.exit(1 if self.failed else 0)


def metrics_rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def step_losses(path):
    """[(step, loss)] of every training step row, in file order."""
    return [(r["step"], r["loss"]) for r in metrics_rows(path) if "loss" in r]


def eval_rows(path):
    return [r for r in metrics_rows(path) if "eval_loss" in r]


def h5_datasets(path):
    """Every dataset in the file: {'/model/fc1.weight': array, ...}."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out["/" + name] = obj[()]
        f.visititems(visit)
    return out


def h5_attrs(path):
    with h5py.File(path, "r") as f:
        return {k: f.attrs[k] for k in f.attrs}


def tensors(path, optim=True):
    """A checkpoint's logical tensors in either format: {'model/<name>': array,
    'optim/<name>/<state>': array} (sharded files are cut out of their units' flat buffers
    through /index, padding dropped)."""
    out = {}
    with h5py.File(path, "r") as f:
        if f.attrs["format"] == "consolidated":
            for name, ds in f["model"].items():
                out[f"model/{name}"] = ds[()]
            if optim and "optim" in f:
                for name, g in f["optim"].items():
                    for state, ds in g.items():
                        out[f"optim/{name}/{state}"] = ds[()]
            return out
        ix = f["index"]
        names = [n.decode() if isinstance(n, bytes) else n for n in ix["names"][()]]
        unit, offset, numel, ndim, dims = (ix[k][()] for k in ("unit", "offset", "numel", "ndim", "dims"))
        states = [s.decode() if isinstance(s, bytes) else s for s in f.attrs["optimizer_states"]] if optim else []
        at = 0
        for i, name in enumerate(names):
            shape = tuple(int(x) for x in dims[at:at + ndim[i]])
            at += ndim[i]
            sl = slice(int(offset[i]), int(offset[i] + numel[i]))
            out[f"model/{name}"] = f[f"shards/{unit[i]}/params"][sl].reshape(shape)
            for st in states:
                out[f"optim/{name}/{st}"] = f[f"shards/{unit[i]}/optim/{st}"][sl].reshape(shape)
    return out


def bitwise_diff(a, b, optim=True):
    """Compares two checkpoints' tensors (either format) byte for byte. Returns (equal, text)."""
    da, db = tensors(a, optim), tensors(b, optim)
    if not da:
        return False, f"{a} holds no tensors"
    if sorted(da) != sorted(db):
        return False, f"tensor names differ: {sorted(set(da) ^ set(db))[:4]}"
    differ = [k for k in da if da[k].dtype != db[k].dtype or da[k].shape != db[k].shape or
              da[k].tobytes() != db[k].tobytes()]
    elems = sum(v.size for v in da.values())
    if differ:
        worst = max((float(np.max(np.abs(da[k].astype(np.float64) - db[k].astype(np.float64)))) for k in differ
                     if da[k].shape == db[k].shape), default=float("nan"))
        return False, f"{len(differ)} of {len(da)} tensors differ (e.g. {differ[0]}, max |diff| {worst:.3g})"
    return True, f"{len(da)} tensors ({elems} values) bitwise equal"


def ckpt_files(d):
    """Sorted names in a checkpoint folder."""
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def complete_ckpts(d):
    return [n for n in ckpt_files(d) if n.startswith("ckpt_") and n.endswith(".h5")]


def ckpt_name(step):
    return f"ckpt_{step:08d}.h5"
