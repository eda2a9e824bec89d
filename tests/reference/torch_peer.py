"""PyTorch 2.x side of jobs/bench-peer.sh (not a test): one rank of a distributed training run.

Launched by mpirun like fsdp_app (one process per rank; rank and world size from Open MPI's
OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE, the gloo rendezvous at MASTER_ADDR:MASTER_PORT),
so both sides start, bind and are measured the same way. Runs in jobs/torch2_venv.sh's venv.

  --write-init FILE   builds the torch twin (torch_models.py) under torch.manual_seed(1) and
                      writes its state_dict as /model/<name> (what fsdp_app's model.init_from
                      reads, as torch_reference.py writes it); no training, no process group.
  --mode MODE         trains from --init for --steps steps:
      fsdp2           FULL_SHARD: torch.distributed.fsdp.fully_shard (FSDP2) on every unit ours
                      wraps (each transformer block / Llama decoder layer / mnist_cnn layer),
                      then the root;
                      reshard_after_forward=True.
      ddp             NO_SHARD: DistributedDataParallel (gradients all-reduced in buckets), the
                      usual PyTorch way to replicate; FSDP2 has no NO_SHARD strategy.
      fsdp1_full, fsdp1_no
                      FullyShardedDataParallel (FSDP1) FULL_SHARD / NO_SHARD, same units.
  --param-dtype bf16  fsdp2 only: MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                      reduce_dtype=torch.float32) on every fully_shard, the loss taken in f32 from
                      the bf16 output (.float(), as torchtitan): what fsdp-hpc's
                      fsdp.mixed_precision.param_dtype: bf16 computes (compute: param_dtype).

The batches are torch_reference.py's (shuffle off): global step s holds samples
[s*B, (s+1)*B), rank r takes the contiguous slice fsdp-hpc's Sampler::rank_slice gives it.
Dropout is off (model.eval(), as torch_reference.py). The loss printed per step is the global
mean (each rank's mean loss averaged over the ranks, all-reduced inside the timed step, as
fsdp_app's is). Rank 0 writes OUT as JSON: losses, step_time_s per step, torch version.
"""
import argparse
import json
import os
import sys
import time

import h5py
import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference  # noqa: E402
from torch_models import LM, Block, Llama, LlamaDecoderLayer, Net  # noqa: E402

BENCH_LM = dict(vocab=256, d_model=512, n_layers=8, n_heads=8, d_ff=2048, seq_len=256)  # input/transformer_bench.yaml
BENCH_LLAMA = dict(vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4, seq_len=256)  # input/llama_bench.yaml
SEQ_LEN = {"transformer": BENCH_LM["seq_len"], "llama": BENCH_LLAMA["seq_len"]}


def build(kind):
    if kind == "transformer":
        return LM(**BENCH_LM)
    return Llama(**BENCH_LLAMA) if kind == "llama" else Net()


def units(model):
    """The modules fsdp-hpc wraps as FSDP units (the root comes on top)."""
    if isinstance(model, (LM, Llama)):  # auto_wrap transformer_layer: each block / decoder layer
        return [m for m in model.modules() if isinstance(m, (Block, LlamaDecoderLayer))]
    # auto_wrap size_based, min_num_params 100: every layer with parameters (conv1 has 320)
    return [m for m in model.children() if sum(p.numel() for p in m.parameters()) >= 100]


def load_init(model, path):
    with h5py.File(path, "r") as f:
        state = {name: torch.from_numpy(f[f"model/{name}"][...]) for name in model.state_dict()}
    model.load_state_dict(state)


def wrap(model, mode, param_dtype="f32"):
    if mode == "fsdp2":
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # public since 2.6
        except ImportError:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        kw = {}
        if param_dtype == "bf16":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for m in units(model):
            fully_shard(m, mesh=mesh, reshard_after_forward=True, **kw)
        fully_shard(model, mesh=mesh, reshard_after_forward=True, **kw)
        return model
    if param_dtype != "f32":
        raise SystemExit(f"torch_peer.py: --param-dtype {param_dtype} is for --mode fsdp2")
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = ShardingStrategy.FULL_SHARD if mode == "fsdp1_full" else ShardingStrategy.NO_SHARD
    policy = ModuleWrapPolicy({type(m) for m in units(model)})
    return FSDP(model, sharding_strategy=strategy, auto_wrap_policy=policy, device_id=torch.device("cpu"),
                use_orig_params=True)


def batches(kind, steps, global_batch, rank, world):
    if kind in SEQ_LEN:  # both language models read the same byte stream (fsdp_app's data.kind text)
        data = torch_reference.text_batches(torch_reference.TEXT_FILE, steps, global_batch, SEQ_LEN[kind])
    else:
        data = torch_reference.fashion_mnist_batches(torch_reference.FASHION_DIR, steps, global_batch)
    # Sampler::rank_slice: contiguous, the first n % world ranks one larger.
    base, extra = divmod(global_batch, world)
    begin = rank * base + min(rank, extra)
    end = begin + base + (1 if rank < extra else 0)
    return [(x[begin:end], y[begin:end]) for x, y in data]


def optimizer(kind, params):
    # fsdp-hpc's settings for the models (input/transformer_bench.yaml, input/llama_bench.yaml,
    # input/fashion_mnist.yaml), given to fsdp_app explicitly by jobs/bench-peer.sh.
    if kind in SEQ_LEN:
        return torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    return torch.optim.Adadelta(params, lr=1.0, rho=0.9, eps=1e-6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, choices=["transformer", "llama", "mnist_cnn"])
    ap.add_argument("--write-init", metavar="FILE")
    ap.add_argument("--mode", choices=["fsdp2", "ddp", "fsdp1_full", "fsdp1_no"])
    ap.add_argument("--init", metavar="FILE")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--global-batch", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", metavar="FILE")
    ap.add_argument("--param-dtype", choices=["f32", "bf16"], default="f32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.write_init:
        torch.manual_seed(1)
        torch_reference.write_state_dict(build(args.model), args.write_init)
        return
    if not (args.mode and args.init and args.out and args.global_batch):
        raise SystemExit("torch_peer.py: --mode, --init, --global-batch and --out are needed to train")

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = build(args.model)
    load_init(model, args.init)
    model.eval()  # dropout off
    model = wrap(model, args.mode, args.param_dtype)
    loss_fn = {"transformer": LM.loss, "llama": Llama.loss, "mnist_cnn": Net.loss}[args.model]
    opt = optimizer(args.model, model.parameters())
    data = batches(args.model, args.steps, args.global_batch, rank, world)

    losses, times = [], []
    for step, (x, y) in enumerate(data):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out.float() if args.param_dtype != "f32" else out, y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        dt = time.perf_counter() - t0
        losses.append(mean.item() / world)
        times.append(dt)
        if rank == 0:
            print(f"torch {args.mode} np {world} step {step + 1}/{args.steps} loss {losses[-1]:.6f} {dt:.3f} s",
                  flush=True)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "mode": args.mode, "np": world, "losses": losses,
                       "step_time_s": times}, f)
            f.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
