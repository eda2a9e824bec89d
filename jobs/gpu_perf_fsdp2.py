"""PyTorch side of run-gpu-checks.sh's performance check (not a test; runs on the GPU machine's own
PyTorch 2.x). One process, world size 1, NCCL.

  --gemm-peak              cuBLAS bf16 GEMM peak on this GPU: torch.matmul of two 8192x8192 bf16
                           matrices (random data), mean of 10 after 3 warm-ups; prints TFLOP/s.
  --fsdp2 (default)        the torch twin of fsdp_app's transformer (torch_models.LM, the same
                           module tree), fully_shard on every block then the root,
                           MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16), f32 master
                           params, AdamW; --steps steps on random tokens, the first --warmup untimed.

Prints one JSON line: tokens_per_s (median timed step), step_time_s, peak_bytes
(torch.cuda.max_memory_allocated), torch version.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def gemm_peak():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    s = start.elapsed_time(end) / 1e3 / 10
    print(json.dumps({"gemm_bf16_tflops": 2 * n**3 / s / 1e12, "torch": torch.__version__}))


def fsdp2(a):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from torch_models import LM, Block

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    torch.manual_seed(1)
    with torch.device("cuda"):
        model = LM(vocab=a.vocab, d_model=a.d_model, n_layers=a.n_layers, n_heads=a.n_heads, d_ff=a.d_ff,
                   seq_len=a.seq_len)
    mesh = init_device_mesh("cuda", (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    for m in model.modules():
        if isinstance(m, Block):
            fully_shard(m, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(1)
    times = []
    for step in range(a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), device="cuda", generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = LM.loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    print(json.dumps({"tokens_per_s": a.batch * a.seq_len / step_s, "step_time_s": step_s,
                      "peak_bytes": torch.cuda.max_memory_allocated(), "loss": loss.item(),
                      "torch": torch.__version__}))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gemm-peak", action="store_true")
    for k, v in dict(vocab=256, d_model=2048, n_layers=16, n_heads=16, d_ff=8192, seq_len=1024, batch=8, steps=7,
                     warmup=2).items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    a = p.parse_args()
    gemm_peak() if a.gemm_peak else fsdp2(a)


if __name__ == "__main__":
    main()
