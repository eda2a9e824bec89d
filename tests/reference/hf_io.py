#!/usr/bin/python3
"""Hugging Face's side of tests/reference/check_hf_io.py (run with the interpreter hf_venv.sh prints).

  hf_io.py save --config v1_1 --out DIR [--dtype f32|bf16] [--max-shard-size 200KB] [--seed 1]
              [--data PAIRS.jsonl --batch-index K ...]
      T5ForConditionalGeneration(t5_reference.CONFIGS[config]) from HF's own init under
      torch.manual_seed(seed), written by save_pretrained (safetensors; a max_shard_size below the
      model's size gives the model.safetensors.index.json form), in the given dtype. With --data:
      prints {"loss": HF's loss on training batch K with the weights as saved (bf16 ones widened
      to float32, as from_pretrained(DIR, torch_dtype=float32) gives them)}.
  hf_io.py loss --config v1_1 --model DIR --data PAIRS.jsonl --batch-index K [--batch 8 ...]
      T5ForConditionalGeneration.from_pretrained(DIR) (float32, train mode: dropout_rate 0), which
      must report no missing, unexpected or mismatched keys; prints one JSON line
      {"loss": HF's loss on training batch K, "loading_info": {...}, "tensors": N}.
The batches are t5_reference.py's (its module docstring is the spec fsdp_app follows).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import t5_reference  # noqa: E402


def save(args):
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(args.seed)
    model = T5ForConditionalGeneration(T5Config(**t5_reference.CONFIGS[args.config]))
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(args.out, max_shard_size=args.max_shard_size, safe_serialization=True)
    if args.data:
        print(json.dumps({"loss": batch_loss(model.float(), args)}))


def batch_loss(model, args):
    batches, _, _ = t5_reference.train_batches(args.data, args.batch_index + 1, args.batch, args.source_len,
                                                args.target_len, args.eval_fraction)
    model.train()  # dropout_rate 0: as fsdp_app's train.dropout false
    with torch.no_grad():
        return t5_reference.batch_loss(model, batches[args.batch_index]).item()


def loss(args):
    from transformers import T5ForConditionalGeneration
    model, info = T5ForConditionalGeneration.from_pretrained(args.model, output_loading_info=True,
                                                             torch_dtype=torch.float32)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise SystemExit(f"hf_io: {args.model} loads with {bad}")
    cfg = t5_reference.CONFIGS[args.config]
    for key in t5_reference.YAML_MODEL_KEYS:
        if getattr(model.config, key) != cfg[key]:
            raise SystemExit(f"hf_io: {args.model}/config.json: {key} {getattr(model.config, key)!r}, "
                             f"expected {cfg[key]!r}")
    print(json.dumps({"loss": batch_loss(model, args), "loading_info": info, "tensors": len(model.state_dict())}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["save", "loss"])
    ap.add_argument("--config", choices=sorted(t5_reference.CONFIGS), required=True)
    ap.add_argument("--out")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--max-shard-size", default="10GB", help="save_pretrained's")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model")
    ap.add_argument("--data")
    ap.add_argument("--batch-index", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--source-len", type=int, default=64)
    ap.add_argument("--target-len", type=int, default=32)
    ap.add_argument("--eval-fraction", type=float, default=0.05)
    args = ap.parse_args()
    torch.set_num_threads(1)
    save(args) if args.command == "save" else loss(args)


if __name__ == "__main__":
    main()
