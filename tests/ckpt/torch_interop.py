#!/usr/bin/python3
"""A consolidated checkpoint is a PyTorch state_dict: trains mnist_cnn on Fashion-MNIST with
fsdp_app (np=2, 20 steps, evaluation on the first 2000 of the 10000 test images at the end,
consolidated checkpoint), loads the file into the torch twin (tests/reference/torch_models.py) with

    import h5py, torch
    from torch_models import Net
    model = Net()
    with h5py.File("ckpt/ckpt_00000020.h5", "r") as f:
        model.load_state_dict({k: torch.from_numpy(v[...]) for k, v in f["model"].items()})

and checks that torch's test loss (log_softmax NLL, mean) and accuracy on the same images equal
fsdp_app's eval_loss / eval_accuracy for those weights (rel 1e-5), as evaluated
  - by the training run itself at step 20 (the weights the checkpoint holds),
  - by checkpoint.resume=THE_FILE at np=4 with nothing left to train (the closing evaluation),
  - by model.init_from=THE_FILE (init_from reads /model only) at np=1: train.steps=0 is not a
    run (steps 0 means "use epochs"), so it trains one SGD step with lr 1e-30, which leaves every
    weight bitwise unchanged (checked through output.save_weights), then evaluates.
Also checks every dataset's crc32 attribute the way the format documents it.

usage: torch_interop.py FSDP_APP        (Debian's /usr/bin/python3 with h5py, numpy, torch)"""
import gzip
import os
import struct
import sys
import time
import zlib

import h5py
import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: pylib
from pylib.ckpt import ckpt_name  # noqa: E402
from pylib.harness import Harness  # noqa: E402
from pylib.metrics import eval_rows  # noqa: E402
from reference.torch_models import Net  # noqa: E402

H = Harness(sys.argv[1], "fsdp_ckpt_torch_")
FASHION = "/usr/share/datasets/fashion-mnist"
# The evaluations compare ours and torch's on the same images; the first 2000 test images (a
# copy of Debian's folder with t10k cut to them) give the same check for a fifth of the CNN's
# forward passes (all 10000: 81 CPU-s for this script, most of it evaluating).
EVAL_IMAGES = 2000
STEPS = 20
RTOL = 1e-5
BASE = ["model.kind=mnist_cnn", "data.kind=fashion_mnist", "train.global_batch_size=64", "train.epochs=0",
        f"train.steps={STEPS}", "train.seed=1", "train.optimizer.kind=adadelta", "train.optimizer.lr=1.0",
        "train.shuffle=true", "train.dropout=true", "train.threads=1", f"train.eval_every={STEPS}",
        "fsdp.sharding_strategy=FULL_SHARD", "fsdp.auto_wrap.policy=size_based", "fsdp.auto_wrap.min_num_params=100",
        "output.log_every=1000"]


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    if struct.unpack(">I", data[:4])[0] != magic:
        raise SystemExit(f"{path}: bad IDX magic")
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def data_folder():
    """Debian's Fashion-MNIST folder with its test set cut to the first EVAL_IMAGES images: the
    train files linked, the t10k files rewritten (IDX header with the new count, gzip)."""
    d = H.path("fashion-mnist")
    os.makedirs(d, exist_ok=True)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        os.symlink(os.path.join(FASHION, name), os.path.join(d, name))
    for name, magic in (("t10k-images-idx3-ubyte.gz", 0x00000803), ("t10k-labels-idx1-ubyte.gz", 0x00000801)):
        a = read_idx(os.path.join(FASHION, name), magic)[:EVAL_IMAGES]
        with gzip.open(os.path.join(d, name), "wb") as f:
            f.write(struct.pack(">I", magic) + struct.pack(">" + "I" * a.ndim, *a.shape) + a.tobytes())
    return d


DATA = data_folder()
BASE.append(f"data.path={DATA}")


def torch_eval(model):
    """fsdp_app's evaluation in torch: the test set, (x/255 - 0.2860)/0.3530, mean NLL and accuracy."""
    images = read_idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz"), 0x00000803)
    labels = read_idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz"), 0x00000801)
    x = (images.astype(np.float32) / np.float32(255.0) - np.float32(0.2860)) / np.float32(0.3530)
    x = torch.from_numpy(np.ascontiguousarray(x)).reshape(-1, 1, 28, 28)
    y = torch.from_numpy(labels.astype(np.int64))
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        for i in range(0, len(y), 1000):
            out = model(x[i:i + 1000])
            loss_sum += float(F.nll_loss(out, y[i:i + 1000], reduction="none").double().sum())
            correct += int((out.argmax(1) == y[i:i + 1000]).sum())
    return loss_sum / len(y), correct / len(y), len(y)


def compare(name, ours, theirs, n):
    (l1, a1), (l2, a2) = ours, theirs
    rel = abs(l1 - l2) / abs(l2)
    samples = round(abs(a1 - a2) * n)
    H.check(name, rel <= RTOL and samples == 0,
            f"eval_loss ours {l1:.9g} torch {l2:.9g} (rel diff {rel:.2e}, tolerance {RTOL:g}); accuracy ours "
            f"{a1:.4f} torch {a2:.4f} ({samples} of {n} samples differ)")


def main():
    torch.set_num_threads(2)
    d = H.path("run")
    ckpt = os.path.join(d, ckpt_name(STEPS))
    results = {}

    def train():
        r = H.run_ok(2, BASE + [f"checkpoint.dir={d}", f"output.metrics={d}/train.jsonl"], timeout=300)
        ev = eval_rows(f"{d}/train.jsonl")
        H.check("fsdp_app trains and saves a consolidated checkpoint", os.path.exists(ckpt) and len(ev) == 1 and
                ev[0]["step"] == STEPS, f"{r.seconds:.1f} s, eval rows {[(e['step'], e['eval_loss']) for e in ev]}")
        results["train"] = (ev[0]["eval_loss"], ev[0]["eval_accuracy"])

    H.case("train", train)
    if "train" not in results:
        H.finish()

    def crc():
        bad, n = [], 0
        with h5py.File(ckpt, "r") as f:
            def visit(name, ds):
                nonlocal n
                if isinstance(ds, h5py.Dataset):
                    n += 1
                    if zlib.crc32(ds[...].astype("<f4").tobytes()) != int(ds.attrs["crc32"]):
                        bad.append(name)
            f.visititems(visit)
        H.check("crc32 attributes match zlib.crc32(ds[...].astype('<f4').tobytes())", n > 0 and not bad,
                f"{n} datasets, {len(bad)} mismatches {bad[:3]}")

    H.case("crc", crc)

    def torch_side():
        t0 = time.time()
        model = Net()
        with h5py.File(ckpt, "r") as f:
            model.load_state_dict({k: torch.from_numpy(v[...]) for k, v in f["model"].items()})
        loss, acc, n = torch_eval(model)
        results["torch"] = (loss, acc)
        results["n"] = n
        print(f"      torch: eval_loss {loss:.9g} accuracy {acc:.4f} on {n} test images ({time.time() - t0:.1f} s)")
        compare("torch on the checkpoint == fsdp_app's evaluation at step 20", results["train"], results["torch"], n)

    H.case("torch", torch_side)
    if "torch" not in results:
        H.finish()

    def resumed():
        r = H.run_ok(4, BASE + [f"checkpoint.resume={ckpt}", f"output.metrics={d}/resume.jsonl"], timeout=300)
        ev = eval_rows(f"{d}/resume.jsonl")
        steps = [x for x in open(f"{d}/resume.jsonl") if '"loss"' in x]
        if len(ev) != 1 or steps:
            raise RuntimeError(f"expected one evaluation and no training step, got {len(ev)} and {len(steps)}: "
                               f"{r.out[-300:]}")
        compare("checkpoint.resume=FILE at np=4 (0 steps left): evaluation == torch's",
                (ev[0]["eval_loss"], ev[0]["eval_accuracy"]), results["torch"], results["n"])

    H.case("resume", resumed)

    def init_from():
        w = os.path.join(d, "after_init_from.h5")
        sets = BASE + [f"model.init_from={ckpt}", "train.steps=1", "train.eval_every=1", "train.optimizer.kind=sgd",
                       "train.optimizer.lr=1e-30", f"output.metrics={d}/init.jsonl", f"output.save_weights={w}"]
        r = H.run_ok(1, sets, timeout=300)
        with h5py.File(ckpt, "r") as f, h5py.File(w, "r") as g:
            names = sorted(f["model"])
            same = names == sorted(g["model"]) and all(f["model"][k][...].tobytes() == g["model"][k][...].tobytes()
                                                        for k in names)
        H.check("model.init_from=FILE loads /model exactly (weights after a 1e-30 SGD step bitwise equal)", same,
                f"{len(names)} tensors, {r.seconds:.1f} s")
        ev = eval_rows(f"{d}/init.jsonl")
        compare("model.init_from=FILE at np=1: evaluation == torch's", (ev[0]["eval_loss"], ev[0]["eval_accuracy"]),
                results["torch"], results["n"])

    H.case("init_from", init_from)
    H.finish()


if __name__ == "__main__":
    main()
