#!/usr/bin/python3
"""PyTorch side of the core benchmark (jobs/bench-core.sh). Not a test.

Times full training steps (batch from memory, forward, loss, backward, optimizer step) of the
two seed models' torch twins (torch_models.py) with the same settings fsdp_app runs:
  mnist_cnn:   batch 64, dropout on (train mode), Adadelta(lr=1.0), Fashion-MNIST batches
               in order (synthetic N(0,1) images when the dataset is missing: same FLOPs).
  transformer: input/transformer_bench.yaml's model (vocab 256, d_model 512, 8 layers, 8 heads,
               d_ff 2048, seq 256), batch 8, AdamW(lr=3e-4), random byte tokens (the FLOPs do
               not depend on the tokens).
Prints one JSON object on stdout: per model the median step time over the timed steps (after
`warmup` untimed ones) and samples/s (tokens/s for the transformer). Progress goes to stderr.

Run with Debian's interpreter: /usr/bin/python3 tests/reference/torch_bench.py --threads 2
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import LM, Net  # noqa: E402

LM_BENCH = dict(vocab=256, d_model=512, n_layers=8, n_heads=8, d_ff=2048, seq_len=256)


def cnn_batches(n, batch):
    try:
        import torch_reference
        return torch_reference.fashion_mnist_batches(torch_reference.FASHION_DIR, n, batch), "fashion_mnist"
    except (OSError, SystemExit):
        g = torch.Generator().manual_seed(1)
        return [(torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
                for _ in range(n)], "synthetic"


def time_steps(model, opt, batches, warmup, label):
    times = []
    for i, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model.loss(model(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
        print(f"torch {label} step {i + 1}/{len(batches)} {dt:.4f} s loss {loss.item():.4f}",
              file=sys.stderr, flush=True)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description="PyTorch side of jobs/bench-core.sh")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cnn-steps", type=int, default=30, help="timed mnist_cnn steps")
    ap.add_argument("--cnn-warmup", type=int, default=5)
    ap.add_argument("--lm-steps", type=int, default=5, help="timed transformer steps")
    ap.add_argument("--lm-warmup", type=int, default=2)
    ap.add_argument("--only", choices=["mnist_cnn", "transformer"], default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    result = {"threads": args.threads, "torch": torch.__version__}

    if args.only in (None, "mnist_cnn"):
        B = 64
        batches, source = cnn_batches(args.cnn_warmup + args.cnn_steps, B)
        model = Net()
        model.train()  # dropout on, as fsdp_app's train.dropout: true
        opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
        step_s = time_steps(model, opt, batches, args.cnn_warmup, "mnist_cnn")
        result["mnist_cnn"] = {"data": source, "batch": B, "timed_steps": args.cnn_steps,
                               "step_s": step_s, "samples_per_s": B / step_s}

    if args.only in (None, "transformer"):
        B, T = 8, LM_BENCH["seq_len"]
        g = torch.Generator().manual_seed(1)
        n = args.lm_warmup + args.lm_steps
        batches = [(torch.randint(0, 256, (B, T), generator=g), torch.randint(0, 256, (B, T), generator=g))
                   for _ in range(n)]
        model = LM(**LM_BENCH)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        step_s = time_steps(model, opt, batches, args.lm_warmup, "transformer")
        result["transformer"] = {"batch": B, "seq_len": T, "timed_steps": args.lm_steps, "step_s": step_s,
                                 "samples_per_s": B / step_s, "tokens_per_s": B * T / step_s}

    print(json.dumps(result))


if __name__ == "__main__":
    main()
