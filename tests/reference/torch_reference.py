#!/usr/bin/python3
"""PyTorch reference run for tests/reference/check_reference.py.

For one model kind: builds the torch twin (torch_models.py) under torch.manual_seed(seed),
writes its initial state_dict to OUT/init.h5 (/model/<name>, float32, PyTorch shapes; what
fsdp_app's model.init_from loads), trains `--steps` optimizer steps on exactly the batches
fsdp_app sees with shuffle off and dropout off, and writes the per-step losses to
OUT/torch_losses.json ({"model": ..., "losses": [...]}).
`--states` also writes torch's whole training state after every step s (1..steps) to
OUT/state_<s, 3 digits>.h5: /model/<name> (the weights), /optim/<name>/<state> (Adadelta's
square_avg and acc_delta, AdamW's exp_avg and exp_avg_sq: the names fsdp-hpc's checkpoints use)
and the root attribute optimizer_step, so that every step can be replayed from torch's state.

The settings mirror tests/reference/<kind>.yaml (keep the two in step):
  mnist_cnn:   Fashion-MNIST train set, (uint8/255 - 0.2860)/0.3530 in float32, step s = samples
               [s*64, (s+1)*64), Adadelta(lr=1.0, rho=0.9, eps=1e-6), F.nll_loss (mean).
               Convolutions run on torch's im2col + BLAS path (mkldnn off), the algorithm
               fsdp-hpc's Conv2d uses: this trajectory amplifies rounding differences ~3x per
               step (near-tied max_pool windows flip), so torch with mkldnn on and torch with it
               off disagree with each other by ~1e-3 relative by step 19. `--mkldnn-too` also
               runs the mkldnn trajectory and stores it as "losses_mkldnn" to show that spread.
  transformer: vocab 256, d_model 64, 2 layers, 4 heads, d_ff 256, seq_len 32; the bytes of one
               text file, sample i = bytes [i*32, i*32+32] (input the first 32, target shifted by
               one), train samples first; batch 8; AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
               weight_decay=0.01); F.cross_entropy over every position (mean).

`--param-dtype bf16`: FSDP's MixedPrecision(param_dtype=torch.bfloat16) at world size 1, the
semantics fsdp-hpc's fsdp.mixed_precision.compute: param_dtype implements. Each step the f32
weights are copied (rounded to nearest even) into a bf16 copy of the model, which runs forward
and backward in bf16; the loss is taken in f32 from the bf16 output (`.float()`, as torchtitan's
loss does); the bf16 gradients, widened, are the f32 weights' gradients, and the optimizer steps
the f32 weights. Every op rounds its output once and computes inside in f32, as PyTorch 2's
kernels do on CUDA and on the CPU (F32_INTERNAL below: where torch 1.13's CPU kernels round
inside, they are wrapped), and nn.MultiheadAttention's core is PyTorch 2's
scaled_dot_product_attention (FlashAttention). `--torch-kernels` leaves torch's own
kernels alone: under PyTorch 2.x (jobs/torch2_venv.sh) that is the peer itself.

Run with Debian's interpreter: /usr/bin/python3 tests/reference/torch_reference.py --model
mnist_cnn --out /tmp/x. `--debug-grads` also prints every parameter's gradient norm after the
first backward and writes the first step's gradients to OUT/grads_step1.h5 (/grad/<name>).
"""
import argparse
import contextlib
import math
import copy
import gzip
import json
import os
import struct
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import LM, Net  # noqa: E402

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
TEXT_FILE = "/usr/share/games/fortunes/fortunes"

LM_CONFIG = dict(vocab=256, d_model=64, n_layers=2, n_heads=4, d_ff=256, seq_len=32)
LM_BATCH = 8
CNN_BATCH = 64


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    got = struct.unpack(">I", data[:4])[0]
    if got != magic:
        raise SystemExit(f"{path}: bad IDX magic {got:#x}")
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_mnist_batches(data_dir, steps, batch):
    images = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"), 0x00000803)
    labels = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"), 0x00000801)
    n = steps * batch
    # torchvision's ToTensor + Normalize, float32 throughout.
    x = images[:n].astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(0.2860)) / np.float32(0.3530)
    x = torch.from_numpy(np.ascontiguousarray(x)).reshape(n, 1, 28, 28)
    y = torch.from_numpy(labels[:n].astype(np.int64))
    return [(x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]) for s in range(steps)]


def text_batches(path, steps, batch, seq_len, eval_fraction=0.05):
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    samples = (len(data) - 1) // seq_len
    train_samples = int(np.floor(samples * (1.0 - eval_fraction)))
    if steps * batch > train_samples:
        raise SystemExit(f"{path}: {train_samples} train samples, need {steps * batch}")
    out = []
    for s in range(steps):
        xs, ys = [], []
        for i in range(s * batch, (s + 1) * batch):
            chunk = data[i * seq_len:i * seq_len + seq_len + 1].astype(np.int64)
            xs.append(chunk[:-1])
            ys.append(chunk[1:])
        out.append((torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))))
    return out


def write_state_dict(model, path, group="model"):
    with h5py.File(path, "w") as f:
        for name, t in model.state_dict().items():
            f[f"{group}/{name}"] = t.detach().float().numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, choices=["mnist_cnn", "transformer"])
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default=None, help="Fashion-MNIST folder or text file")
    ap.add_argument("--debug-grads", action="store_true")
    ap.add_argument("--states", action="store_true",
                    help="write the weights and optimizer state after every step (state_NNN.h5)")
    ap.add_argument("--param-dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16: compute in bf16 on bf16 copies of the f32 weights (FSDP's MixedPrecision)")
    ap.add_argument("--torch-kernels", action="store_true",
                    help="bf16: torch's own CPU kernels as they are, no F32InternalOps (PyTorch 2.x's compute in f32)")
    ap.add_argument("--mkldnn-too", action="store_true",
                    help="also record the trajectory with torch's mkldnn convolutions")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)

    if args.model == "mnist_cnn":
        model = Net()
        batches = fashion_mnist_batches(args.data or FASHION_DIR, args.steps, CNN_BATCH)
    else:
        model = LM(**LM_CONFIG)
        batches = text_batches(args.data or TEXT_FILE, args.steps, LM_BATCH, LM_CONFIG["seq_len"])
    write_state_dict(model, os.path.join(args.out, "init.h5"))
    init = copy.deepcopy(model.state_dict())

    result = {"model": args.model}
    # mkldnn off: the convolutions' algorithm (below); torch 2.x's bf16 GEMMs without oneDNN
    # accumulate in f32, as the wrapped ops do.
    with torch.backends.mkldnn.flags(enabled=False):
        result["losses"] = train(model, args.model, batches, args.out if args.debug_grads else None,
                                 args.out if args.states else None, args.param_dtype, not args.torch_kernels)
    if args.mkldnn_too:
        model.load_state_dict(init)
        with torch.backends.mkldnn.flags(enabled=True):
            result["losses_mkldnn"] = train(model, args.model, batches, None)
    with open(os.path.join(args.out, "torch_losses.json"), "w") as f:
        json.dump(result, f)
        f.write("\n")


def write_state(model, opt, path):
    """Weights and optimizer state, named as in fsdp-hpc's consolidated checkpoints."""
    names = {id(p): n for n, p in model.named_parameters()}
    with h5py.File(path, "w") as f:
        for name, t in model.state_dict().items():
            f[f"model/{name}"] = t.detach().float().numpy()
        steps = set()
        for p, st in opt.state.items():
            for key, v in st.items():
                if key == "step":
                    steps.add(int(v))
                else:
                    f[f"optim/{names[id(p)]}/{key}"] = v.detach().float().numpy()
        if len(steps) != 1:
            raise SystemExit(f"{path}: parameters disagree on the optimizer step: {sorted(steps)}")
        f.attrs["optimizer_step"] = steps.pop()


# The ops the models call, each computing in f32 on the widened inputs and rounding its output once
# to the inputs' dtype: PyTorch's CUDA kernels' arithmetic for bf16 (cuBLAS accumulates in f32,
# the norm, softmax, GELU and embedding-backward kernels compute in f32). torch 1.13's CPU kernels
# differ in three places: its bf16 GEMM without oneDNN (no AVX-512: CI's CPUs) rounds its running
# sums to bf16 (step 1's loss 2.8e-5 away), its LayerNorm rounds the statistics' steps (520 of
# 1024 outputs of a (16, 64) test differ), and its embedding backward adds in bf16. Autograd still
# decides where the backward rounds: each wrapped op's backward is the f32 op's, with the
# gradients of its bf16 inputs rounded once.
F32_INTERNAL = {F: ["linear", "layer_norm", "embedding", "softmax", "log_softmax", "gelu", "conv2d"],
                torch: ["bmm", "baddbmm"]}


class FlashAttention(torch.autograd.Function):
    """Attention on (N, T, hd) bf16 q, k, v as PyTorch 2's F.scaled_dot_product_attention computes it
    in bf16 (flash attention, on the CPU and CUDA; FlashAttention-2's algorithm, one key block):
    forward: scores s, their max m and sum l of exp(s - m) in f32, the exponentials rounded to bf16
    as the operand of the GEMM with v, its f32 result times 1 / l rounded to bf16. Backward: P =
    exp(s - m) / l in f32, dV = round(P)^T dO, dP = dO v^T, D = rowsum(dO * O), dS = P (dP - D),
    dq = round(dS) k * scale, dk = round(dS)^T q * scale, each rounded to bf16. torch 2.15's own CPU
    kernel, fed the same bf16 q, k, v (T 32, causal mask), gives outputs off in the last bit in
    ~1-4% of elements (its exp and sum orders), against 25-50% when P is rounded after the division."""

    @staticmethod
    def forward(ctx, q, k, v, mask):
        scale = 1.0 / math.sqrt(q.shape[-1])
        s = torch.bmm(q.float(), k.float().transpose(-2, -1)) * scale
        if mask is not None:
            s = s + mask.float()
        m = s.max(dim=-1, keepdim=True).values
        e = torch.exp(s - m)
        inv = 1.0 / e.sum(dim=-1, keepdim=True)
        out = (torch.bmm(e.bfloat16().float(), v.float()) * inv).bfloat16()
        ctx.save_for_backward(q, k, v, e * inv, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, p, out = ctx.saved_tensors
        r = lambda t: t.bfloat16().float()  # noqa: E731
        do = d_out.float()
        dv = torch.bmm(r(p).transpose(-2, -1), do)
        dp = torch.bmm(do, v.float().transpose(-2, -1))
        d = (do * out.float()).sum(dim=-1, keepdim=True)
        ds = r(p * (dp - d))
        dq = torch.bmm(ds, k.float()) * ctx.scale
        dk = torch.bmm(ds.transpose(-2, -1), q.float()) * ctx.scale
        return dq.bfloat16(), dk.bfloat16(), dv.bfloat16(), None


def f32_internal(fn):
    def op(*args, **kwargs):
        low = next((a.dtype for a in args if torch.is_tensor(a) and a.dtype in (torch.bfloat16, torch.float16)),
                   None)
        if low is None:
            return fn(*args, **kwargs)
        wide = lambda a: a.float() if torch.is_tensor(a) and a.is_floating_point() else a  # noqa: E731
        out = fn(*[wide(a) for a in args], **{k: wide(v) for k, v in kwargs.items()})
        return out.to(low)
    return op


def mha_as_sdpa(module):
    """module's nn.MultiheadAttentions (self-attention, batch_first, need_weights=False) as PyTorch
    2's forward runs them: the packed in-projection, scaled_dot_product_attention, out_proj (torch
    1.13's inlines a bmm/softmax/bmm core instead)."""
    def forward(m, x, _k, _v, attn_mask=None, need_weights=False):
        B, T, C = x.shape
        H = m.num_heads
        q, k, v = F.linear(x, m.in_proj_weight, m.in_proj_bias).chunk(3, dim=-1)
        heads = lambda t: t.reshape(B, T, H, C // H).transpose(1, 2).reshape(B * H, T, C // H)  # noqa: E731
        o = FlashAttention.apply(heads(q), heads(k), heads(v), attn_mask)
        o = o.reshape(B, H, T, C // H).transpose(1, 2).reshape(B, T, C)
        return F.linear(o, m.out_proj.weight, m.out_proj.bias), None
    for m in module.modules():
        if isinstance(m, torch.nn.MultiheadAttention):
            m.forward = (lambda m: lambda *a, **kw: forward(m, *a, **kw))(m)
    return module


class F32InternalOps:
    """Within: F32_INTERNAL's functions wrapped by f32_internal (nn.Linear, nn.LayerNorm,
    nn.MultiheadAttention's projections, bmm and softmax all call them by these names)."""

    def __enter__(self):
        self.saved = [(mod, name, getattr(mod, name)) for mod, names in F32_INTERNAL.items() for name in names]
        for mod, name, fn in self.saved:
            setattr(mod, name, f32_internal(fn))

    def __exit__(self, *exc):
        for mod, name, fn in self.saved:
            setattr(mod, name, fn)


def train(model, kind, batches, grads_dir, states_dir=None, param_dtype="f32", wrap_ops=True):
    """Trains from the model's current weights with a fresh optimizer; returns the losses."""
    if kind == "mnist_cnn":
        opt = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.9, eps=1e-6, foreach=False)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01, foreach=False)
    # Dropout off: eval() turns it off, and neither model has a layer whose math differs
    # otherwise (no batch norm; MultiheadAttention's dropout is 0; its eval fast path is not
    # taken while gradients are needed).
    model.eval()
    low = copy.deepcopy(model).to(torch.bfloat16) if param_dtype == "bf16" else None
    if low is not None and wrap_ops:
        mha_as_sdpa(low)
    losses = []
    for step, (x, y) in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        if low is None:
            loss = model.loss(model(x), y)
            loss.backward()
        else:
            with torch.no_grad():
                for pl, p in zip(low.parameters(), model.parameters()):
                    pl.copy_(p)  # rounded to nearest even
            low.zero_grad(set_to_none=True)
            xl = x.to(torch.bfloat16) if x.is_floating_point() else x
            with F32InternalOps() if wrap_ops else contextlib.nullcontext():
                loss = model.loss(low(xl).float(), y)
                loss.backward()
            for pl, p in zip(low.parameters(), model.parameters()):
                p.grad = pl.grad.float()
        if step == 0 and grads_dir:
            with h5py.File(os.path.join(grads_dir, "grads_step1.h5"), "w") as f:
                for name, p in model.named_parameters():
                    g = p.grad.detach().float()
                    f[f"grad/{name}"] = g.numpy()
                    print(f"grad_norm {name} {g.double().norm().item():.9g}")
        opt.step()
        losses.append(loss.item())
        if states_dir:
            write_state(model, opt, os.path.join(states_dir, f"state_{step + 1:03d}.h5"))
    return losses


if __name__ == "__main__":
    main()
