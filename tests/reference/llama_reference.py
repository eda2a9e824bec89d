#!/usr/bin/python3
"""Hugging Face Llama reference run for tests/reference/check_llama.py (model.kind: llama against
HF's LlamaForCausalLM, transformers 4.36.2 on Debian's torch 1.13, eager attention).

Run with the interpreter that tests/reference/hf_venv.sh prints:
  PY=$(bash tests/reference/hf_venv.sh)
  $PY tests/reference/llama_reference.py --config gqa --out /tmp/llama/gqa
  $PY tests/reference/llama_reference.py --config gqa --loss-of A.h5 [FOLDER ...]

Training run: LlamaForCausalLM(CONFIGS[config]) under torch.manual_seed(seed), train mode,
`--steps` steps of torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
one thread. Writes to OUT:
  init.h5         the initial weights, /model/<state_dict name> float32 (a tied model's
                  lm_head.weight left out: it is model.embed_tokens.weight)
  state_dict.h5   the same with every name of the state_dict (a tied lm_head.weight included)
  hf_init/        the same weights as save_pretrained writes them: config.json and safetensors
                  shards of at most --shard-kb KB with model.safetensors.index.json
  hf_losses.json  {"config", "losses": [loss of step 1..steps]}
  final.h5        the weights after the last step, as init.h5

Data (fsdp_app's data: {kind: text, path, eval_fraction: F} with model.seq_len T, shuffle off):
  the bytes of --data; samples = (bytes - 1) // T; n_train = floor(samples * (1 - F)); sample i's
  inputs are bytes [i*T, i*T + T), its targets bytes [i*T + 1, i*T + T + 1); step s (0-based)
  takes samples [s*B, (s+1)*B). The loss is the mean cross-entropy of the logits against the
  targets: HF's own loss when labels = inputs, which shifts inside the model.
"""
import argparse
import contextlib
import json
import math
import os

import h5py
import numpy as np
import torch

TEXT = "/usr/share/games/fortunes/fortunes"
# Each config's model keys: HF's LlamaConfig names, as check_llama.py's yaml files give them.
CONFIGS = {
    # grouped-query attention (2 key/value heads for 4 query heads), untied head, HF's defaults
    "gqa": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2),
    # tied head, biases on the attention projections, linear rope scaling, Llama 3's theta and eps
    "tied": dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, tie_word_embeddings=True, attention_bias=True,
                 rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=500000.0, rms_norm_eps=1e-5),
}
SEED = 1


def config_of(name):
    from transformers import LlamaConfig
    return LlamaConfig(**CONFIGS[name], attn_implementation="eager")


def batches(path, seq_len, batch, eval_fraction, steps):
    data = np.frombuffer(open(path, "rb").read(), dtype=np.uint8).astype(np.int64)
    samples = (len(data) - 1) // seq_len
    n_train = math.floor(samples * (1.0 - eval_fraction))
    out = []
    for s in range(steps):
        rows = [(s * batch + k) % n_train for k in range(batch)]
        x = np.stack([data[i * seq_len:i * seq_len + seq_len] for i in rows])
        y = np.stack([data[i * seq_len + 1:i * seq_len + seq_len + 1] for i in rows])
        out.append((torch.from_numpy(x), torch.from_numpy(y)))
    return out


def loss_of(model, x, y):
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def write_h5(model, path, tied, aliases=False):
    """/model/<name> of the state_dict; a tied lm_head.weight only with aliases (the whole
    state_dict, as torch.save would hold it)."""
    with h5py.File(path, "w") as f:
        for name, t in model.state_dict().items():
            if tied and name == "lm_head.weight" and not aliases:
                continue
            f.create_dataset(f"model/{name}", data=t.detach().float().numpy())


def load_into(model, path, tied):
    """An .h5 (/model/<name>) or a folder (from_pretrained) into a model of the same config."""
    if os.path.isdir(path):
        from transformers import LlamaForCausalLM
        return LlamaForCausalLM.from_pretrained(path, attn_implementation="eager", torch_dtype=torch.float32)
    with h5py.File(path, "r") as f:
        state = {}
        f["model"].visititems(lambda n, o: state.__setitem__(n, torch.from_numpy(o[...]))
                              if isinstance(o, h5py.Dataset) else None)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), required=True)
    ap.add_argument("--data", default=TEXT)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-fraction", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--shard-kb", type=int, default=64)
    ap.add_argument("--out")
    ap.add_argument("--loss-of", nargs="+", metavar="FILE", help="print each file's first-batch loss as JSON")
    ap.add_argument("--generate", metavar="FILE", help="greedy generate() from FILE's weights; print JSON")
    ap.add_argument("--generate-n", type=int, default=4, help="validation samples decoded")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import LlamaForCausalLM
    tied = CONFIGS[args.config].get("tie_word_embeddings", False)
    if args.generate:
        # The first validation samples' first prompt-len bytes (fsdp_app's generate.prompt_len),
        # decoded greedily; each row's ids after the prompt, cut after the eos as fsdp_app prints them.
        model = load_into(LlamaForCausalLM(config_of(args.config)), args.generate, tied)
        model.eval()
        raw = np.frombuffer(open(args.data, "rb").read(), dtype=np.uint8).astype(np.int64)
        samples = (len(raw) - 1) // args.seq_len
        first_eval = math.floor(samples * (1.0 - args.eval_fraction))
        rows = [raw[(first_eval + i) * args.seq_len:(first_eval + i) * args.seq_len + args.prompt_len]
                for i in range(args.generate_n)]
        eos = model.config.eos_token_id
        with torch.no_grad():
            out = model.generate(input_ids=torch.from_numpy(np.stack(rows)), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, num_beams=1, pad_token_id=eos)
        result = []
        for row in out[:, args.prompt_len:].tolist():
            ids = []
            for t in row:
                ids.append(t)
                if t == eos:
                    break
            result.append(ids)
        print(json.dumps(result))
        return
    data = batches(args.data, args.seq_len, args.batch, args.eval_fraction, args.steps)
    if args.loss_of:
        out = {}
        for path in args.loss_of:
            model = load_into(LlamaForCausalLM(config_of(args.config)), path, tied)
            model.train()
            with torch.no_grad():
                out[path] = float(loss_of(model, *data[0]))
        print(json.dumps(out))
        return
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config_of(args.config))
    model.train()
    write_h5(model, os.path.join(args.out, "init.h5"), tied)
    write_h5(model, os.path.join(args.out, "state_dict.h5"), tied, aliases=True)
    with contextlib.redirect_stdout(None):
        model.save_pretrained(os.path.join(args.out, "hf_init"), safe_serialization=True,
                              max_shard_size=f"{args.shard_kb}KB")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    json.dump({"config": args.config, "losses": losses}, open(os.path.join(args.out, "hf_losses.json"), "w"))
    write_h5(model, os.path.join(args.out, "final.h5"), tied)
    print(f"llama_reference: {args.config}: {args.steps} steps, loss {losses[0]:.6f} -> {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
