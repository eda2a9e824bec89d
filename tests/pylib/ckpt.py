"""Checkpoint files as the suites read them (h5py, numpy): every dataset, the root attributes, the
logical tensors of either format, a bitwise comparison, and the folder's file names."""
import os

import h5py
import numpy as np


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
