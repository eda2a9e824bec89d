#!/usr/bin/python3
"""Hugging Face T5 reference run for tests/reference/check_t5.py (model.kind: t5 against HF's
T5ForConditionalGeneration, transformers 4.36.2 on Debian's torch 1.13).

Run with the interpreter that tests/reference/hf_venv.sh prints:
  PY=$(bash tests/reference/hf_venv.sh)
  $PY tests/reference/t5_pairs.py /tmp/t5/pairs.jsonl
  $PY tests/reference/t5_reference.py --config v1_0 --data /tmp/t5/pairs.jsonl --out /tmp/t5/v1_0
  $PY tests/reference/t5_reference.py --print-presets [--hf-count]
  $PY tests/reference/t5_reference.py --config v1_0 --data FILE.jsonl --loss-of A.h5 [B.h5 ...]

Training run: T5ForConditionalGeneration(CONFIGS[config]) under torch.manual_seed(seed), in
train mode (dropout_rate 0), `--steps` steps of torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999),
eps=1e-8, weight_decay=0.01) on the batches below, one thread. Writes to OUT:
  init.h5          the initial weights, /model/<state_dict name> float32 at torch's shape, for
                   fsdp_app's model.init_from. The tied aliases are left out: encoder.embed_tokens
                   .weight and decoder.embed_tokens.weight always (the same tensor as shared.weight),
                   and lm_head.weight when tie_word_embeddings; the root attribute skipped_aliases
                   lists them (alias_of = "shared.weight").
  hf_losses.json   {"config", "losses": [loss of step 1..steps], and the data settings}
  final.h5         the weights after the last step, same layout as init.h5
  step1_grads.h5   /grad/<name>: the gradients of the first backward, before the optimizer step
                   (shared.weight's sums its three uses: both embeddings and, tied, lm_head)
  buckets.json     the relative-position bucket of every relative position (key - query) the
                   encoder (bidirectional) and the decoder (causal) use, as HF computes it: in
                   float32 (log of float32 / max_exact, truncated), which is not always what exact
                   arithmetic gives (see `float32_edges`: positions where they differ).

Data (fsdp_app's data: {kind: seq2seq, path, source: text, target: headline, source_len: S,
target_len: L, eval_fraction: F}; check_t5.py's yaml files hold the same numbers):
  rows           the JSON lines of --data in file order (t5_pairs.py writes them).
  split          n_eval = floor(rows * F) in double precision (C++: std::floor(double(rows) * F));
                 the first rows - n_eval rows train, the last n_eval evaluate.
  tokens         ByT5's byte level: id = UTF-8 byte + 3; pad 0, eos 1 (2 = unk, never produced).
  input_ids      bytes of row[source] truncated to S - 1 tokens, eos, pad 0 up to S.
  attention_mask input_ids != 0 (the eos is always attended).
  labels         bytes of row[target] truncated to L - 1, eos, -100 up to L.
  decoder_input_ids  HF's _shift_right(labels): [0] + labels[:-1] with -100 -> 0 (pad); the
                 decoder has no padding mask (causal only: the padding comes after every real
                 token, so no label position sees it).
  batches        shuffle off: step s (0-based) takes train rows [s*B, (s+1)*B), B the global batch.
  loss           HF's: CrossEntropyLoss(ignore_index=-100), the mean over the batch's label tokens
                 that are not -100.
"""
import argparse
import contextlib
import json
import math
import os

import h5py
import numpy as np
import torch

PAD, EOS, UNK = 0, 1, 2
BYTE_OFFSET = 3
IGNORE = -100
ALIAS_OF = "shared.weight"

BASE = dict(vocab_size=259, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="relu",
            tie_word_embeddings=True, dropout_rate=0.0, layer_norm_epsilon=1e-6, initializer_factor=1.0,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
# The two tiny models of the check; tests/reference/t5_<name>.yaml hold the same model keys.
CONFIGS = {
    "v1_0": dict(BASE),
    "v1_1": dict(BASE, feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=3, d_ff=96),
}
# The keys fsdp_app's model section takes (HF's T5Config names); the others stay HF's defaults
# above (layer_norm_epsilon, initializer_factor and the token ids are fixed in the C++ model).
YAML_MODEL_KEYS = ["vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
                   "relative_attention_num_buckets", "relative_attention_max_distance", "feed_forward_proj",
                   "tie_word_embeddings", "dropout_rate"]

# The published checkpoints' dimensions, as the hub's config.json files have them (vocab_size
# 32128, 32 buckets, max_distance 128 for all). t5-* (original T5, Raffel et al. 2020): ReLU,
# tied embeddings; their config.json has no num_decoder_layers (HF then uses num_layers) and no
# feed_forward_proj (default "relu"). google/t5-v1_1-*: gated-GELU ("gelu_new", the tanh form),
# untied lm_head. Source: the hub's config.json files as known to the author (the hub is not
# reachable from here), not read from it. Checks: param_count() of t5-small, t5-base and t5-large
# gives the published 60,506,624, 222,903,552 and 737,668,096, and `--print-presets --hf-count`
# builds every preset of at most 1e9 parameters in transformers and counts its state_dict.
PRESETS = {
    #                          d_model d_kv  d_ff  layers dec_layers heads  ffn          tied
    "t5-small":               (512,   64,   2048,  6,  6,   8, "relu",       True),
    "t5-base":                (768,   64,   3072, 12, 12,  12, "relu",       True),
    "t5-large":               (1024,  64,   4096, 24, 24,  16, "relu",       True),
    "t5-3b":                  (1024, 128,  16384, 24, 24,  32, "relu",       True),
    "t5-11b":                 (1024, 128,  65536, 24, 24, 128, "relu",       True),
    "google/t5-v1_1-small":   (512,   64,   1024,  8,  8,   6, "gated-gelu", False),
    "google/t5-v1_1-base":    (768,   64,   2048, 12, 12,  12, "gated-gelu", False),
    "google/t5-v1_1-large":   (1024,  64,   2816, 24, 24,  16, "gated-gelu", False),
    "google/t5-v1_1-xl":      (2048,  64,   5120, 24, 24,  32, "gated-gelu", False),
    "google/t5-v1_1-xxl":     (4096,  64,  10240, 24, 24,  64, "gated-gelu", False),
}


def preset_config(name):
    d_model, d_kv, d_ff, layers, dec_layers, heads, ffn, tied = PRESETS[name]
    return dict(vocab_size=32128, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers,
                num_decoder_layers=dec_layers, num_heads=heads, relative_attention_num_buckets=32,
                relative_attention_max_distance=128, feed_forward_proj=ffn, tie_word_embeddings=tied)


def param_count(c):
    """Elements of the state_dict without the tied aliases (shared.weight counted once)."""
    d, inner, ff_mats = c["d_model"], c["num_heads"] * c["d_kv"], 3 if c["feed_forward_proj"].startswith("gated") else 2
    bias = c["relative_attention_num_buckets"] * c["num_heads"]  # first block of each stack only
    attn = 4 * d * inner  # q, k, v: d -> inner; o: inner -> d; no biases anywhere in T5
    ff = ff_mats * d * c["d_ff"]
    enc = c["num_layers"] * (attn + ff + 2 * d) + bias + d
    dec = c["num_decoder_layers"] * (2 * attn + ff + 3 * d) + bias + d
    emb = c["vocab_size"] * d * (1 if c["tie_word_embeddings"] else 2)
    return emb + enc + dec


def aliases(cfg):
    """state_dict keys that are the same tensor as shared.weight (not written to our files)."""
    return ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"] + \
        (["lm_head.weight"] if cfg["tie_word_embeddings"] else [])


# ---- data -----------------------------------------------------------------------------------------

def read_rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def split_rows(rows, eval_fraction):
    n_eval = math.floor(len(rows) * eval_fraction)
    return rows[:len(rows) - n_eval], rows[len(rows) - n_eval:]


def byte_ids(text, length, fill):
    ids = [b + BYTE_OFFSET for b in text.encode("utf-8")][:length - 1] + [EOS]
    return ids + [fill] * (length - len(ids))


def make_batch(rows, source_len, target_len, source="text", target="headline"):
    """Lists of ints (no torch): input_ids, attention_mask, labels, decoder_input_ids."""
    input_ids = [byte_ids(r[source], source_len, PAD) for r in rows]
    labels = [byte_ids(r[target], target_len, IGNORE) for r in rows]
    attention_mask = [[int(t != PAD) for t in row] for row in input_ids]
    decoder_input_ids = [[PAD] + [PAD if t == IGNORE else t for t in row[:-1]] for row in labels]
    return dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                decoder_input_ids=decoder_input_ids)


def train_batches(path, steps, batch, source_len, target_len, eval_fraction):
    rows = read_rows(path)
    train, _ = split_rows(rows, eval_fraction)
    if steps * batch > len(train):
        raise SystemExit(f"t5_reference: {path}: {len(rows)} rows, {len(train)} train rows "
                         f"(eval_fraction {eval_fraction}); {steps} steps of {batch} need {steps * batch}")
    out = []
    for s in range(steps):
        b = make_batch(train[s * batch:(s + 1) * batch], source_len, target_len)
        out.append({k: torch.tensor(v, dtype=torch.long) for k, v in b.items()})
    return out, len(rows), len(train)


# ---- model and files ------------------------------------------------------------------------------

def build(cfg_name, seed=None):
    from transformers import T5Config, T5ForConditionalGeneration
    if seed is not None:
        torch.manual_seed(seed)
    model = T5ForConditionalGeneration(T5Config(**CONFIGS[cfg_name]))
    check_aliases(model, CONFIGS[cfg_name])
    return model


def check_aliases(model, cfg):
    """The skipped keys must be exactly the state_dict entries that share shared.weight's storage."""
    sd = model.state_dict()
    ptr = sd[ALIAS_OF].data_ptr()
    same = sorted(k for k, v in sd.items() if v.data_ptr() == ptr and k != ALIAS_OF)
    if same != sorted(aliases(cfg)):
        raise SystemExit(f"t5_reference: tensors sharing {ALIAS_OF}: {same}, expected {sorted(aliases(cfg))}")
    ptrs = {}
    for k, v in sd.items():
        if k != ALIAS_OF and k not in same:
            if v.data_ptr() in ptrs:
                raise SystemExit(f"t5_reference: {k} shares storage with {ptrs[v.data_ptr()]}")
            ptrs[v.data_ptr()] = k


def write_weights(model, cfg, path, group="model"):
    skip = set(aliases(cfg))
    with h5py.File(path, "w") as f:
        for name, t in model.state_dict().items():
            if name not in skip:
                f[f"{group}/{name}"] = t.detach().float().numpy()
        f.attrs["skipped_aliases"] = sorted(skip)
        f.attrs["alias_of"] = ALIAS_OF


def read_group(path, group="model"):
    """{name: array} of every dataset under /group (names relative to it)."""
    out = {}
    with h5py.File(path, "r") as f:
        if group not in f:
            raise SystemExit(f"t5_reference: {path} has no /{group} group")
        f[group].visititems(lambda n, o: out.__setitem__(n, o[...]) if isinstance(o, h5py.Dataset) else None)
    return out


def load_weights(model, cfg, path):
    """Our file into a fresh HF model: the aliases filled from shared.weight, load_state_dict strict."""
    w = read_group(path)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in w.items()}
    if ALIAS_OF not in sd:
        raise SystemExit(f"t5_reference: {path}: no /model/{ALIAS_OF}")
    for a in aliases(cfg):
        if a in sd:
            raise SystemExit(f"t5_reference: {path} holds the tied alias /model/{a} (only {ALIAS_OF} is written)")
        sd[a] = sd[ALIAS_OF]
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        raise SystemExit(f"t5_reference: {path} does not load into T5ForConditionalGeneration: "
                         + " ".join(str(e).split())[:600])


def batch_loss(model, b):
    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
    return out.loss


def check_spec(model, b):
    """HF's own decoder inputs and loss equal the spec's (module docstring)."""
    got = model._shift_right(b["labels"])
    if not torch.equal(got, b["decoder_input_ids"]):
        raise SystemExit("t5_reference: HF's _shift_right(labels) differs from the spec's decoder_input_ids")
    with torch.no_grad():
        hf = batch_loss(model, b)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       decoder_input_ids=b["decoder_input_ids"]).logits
        mask = b["labels"] != IGNORE
        lp = torch.log_softmax(logits.double(), dim=-1)
        nll = -lp.gather(-1, b["labels"].clamp(min=0).unsqueeze(-1)).squeeze(-1)
        ours = (nll * mask).sum() / mask.sum()
    if abs(hf.item() - ours.item()) > 1e-6 * abs(ours.item()):
        raise SystemExit(f"t5_reference: HF's loss {hf.item()!r} is not the mean token cross-entropy "
                         f"{ours.item()!r} of the spec")


def buckets(cfg_name, source_len, target_len):
    from transformers.models.t5.modeling_t5 import T5Attention
    c = CONFIGS[cfg_name]
    nb, md = c["relative_attention_num_buckets"], c["relative_attention_max_distance"]

    def exact(rel, bidirectional):
        n, ret = nb, 0
        if bidirectional:
            n //= 2
            ret += n if rel > 0 else 0
            rel = abs(rel)
        else:
            rel = -min(rel, 0)
        max_exact = n // 2
        if rel < max_exact:
            return ret + rel
        # exact real arithmetic: the largest k with max_exact * (md/max_exact)^(k/(n-max_exact)) <= rel
        k = 0
        while k + 1 < n - max_exact and \
                max_exact * (md / max_exact) ** ((k + 1) / (n - max_exact)) <= rel * (1 + 1e-12):
            k += 1
        return ret + min(max_exact + k, n - 1)

    out = {}
    for side, length, bidir in (("encoder", source_len, True), ("decoder", target_len, False)):
        rel = torch.arange(-(length - 1), length, dtype=torch.long)
        b = T5Attention._relative_position_bucket(rel, bidirectional=bidir, num_buckets=nb, max_distance=md)
        rel_l, b_l = rel.tolist(), b.tolist()
        out[side] = {"bidirectional": bidir, "relative_position": rel_l, "bucket": b_l,
                     "float32_edges": [[r, x, exact(r, bidir)] for r, x in zip(rel_l, b_l) if x != exact(r, bidir)]}
    out["note"] = ("relative_position = key position - query position; float32_edges lists "
                   "[relative_position, HF's bucket, exact arithmetic's bucket] where they differ")
    return out


# ---- commands -------------------------------------------------------------------------------------

def print_presets(hf_count, limit):
    print("| name | d_model | d_kv | d_ff | num_layers | num_decoder_layers | num_heads | feed_forward_proj "
          "| tie_word_embeddings | vocab_size | buckets | max_distance | parameters" +
          (" | HF state_dict count |" if hf_count else " |"))
    print("|" + "---|" * (14 if hf_count else 13))
    for name in PRESETS:
        c = preset_config(name)
        n = param_count(c)
        row = (f"| {name} | {c['d_model']} | {c['d_kv']} | {c['d_ff']} | {c['num_layers']} | "
               f"{c['num_decoder_layers']} | {c['num_heads']} | {c['feed_forward_proj']} | "
               f"{str(c['tie_word_embeddings']).lower()} | {c['vocab_size']} | "
               f"{c['relative_attention_num_buckets']} | {c['relative_attention_max_distance']} | {n:,}")
        if hf_count:
            row += f" | {hf_state_dict_count(c):,}" if n <= limit else " | (not built)"
        print(row + " |", flush=True)


def hf_state_dict_count(c):
    """Builds the preset in HF without initialising it and counts its state_dict without aliases."""
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.modeling_utils import no_init_weights
    with no_init_weights():
        model = T5ForConditionalGeneration(T5Config(**c))
    skip = set(aliases(c))
    n = sum(t.numel() for k, t in model.state_dict().items() if k not in skip)
    del model
    return n


def loss_of(args):
    """HF's loss on the first training batch with each file's weights loaded (strict)."""
    batches, _, _ = train_batches(args.data, 1, args.batch, args.source_len, args.target_len, args.eval_fraction)
    cfg = CONFIGS[args.config]
    out = {}
    for path in args.loss_of:
        model = build(args.config, seed=0)
        load_weights(model, cfg, path)
        model.train()
        with torch.no_grad():
            out[path] = batch_loss(model, batches[0]).item()
    print(json.dumps(out))


def generate_of(args):
    """HF's generate() (do_sample off) on the first --generate-n validation rows with FILE.h5's
    weights: prints {"greedy": [ids...], "beam": [ids...]} per row, no start token, up to and with
    the eos (HF pads finished rows; the padding is dropped)."""
    rows = read_rows(args.data)
    _, held = split_rows(rows, args.eval_fraction)
    b = make_batch(held[:args.generate_n], args.source_len, args.target_len)
    cfg = CONFIGS[args.config]
    model = build(args.config, seed=0)
    load_weights(model, cfg, args.generate)
    model.eval()
    ids = torch.tensor(b["input_ids"], dtype=torch.long)
    mask = torch.tensor(b["attention_mask"], dtype=torch.long)

    def trimmed(seqs):
        out = []
        for row in seqs.tolist():
            row = row[1:]  # decoder_start_token_id
            out.append(row[:row.index(EOS) + 1] if EOS in row else row)
        return out

    out = {}
    with torch.no_grad():
        for name, beams in (("greedy", 1), ("beam", args.generate_beams)):
            seqs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.target_len, num_beams=beams,
                                  do_sample=False, early_stopping=False, length_penalty=1.0)
            out[name] = trimmed(seqs)
    print(json.dumps(out))


def train(args):
    cfg = CONFIGS[args.config]
    batches, n_rows, n_train = train_batches(args.data, args.steps, args.batch, args.source_len, args.target_len,
                                             args.eval_fraction)
    os.makedirs(args.out, exist_ok=True)
    model = build(args.config, seed=args.seed)
    write_weights(model, cfg, os.path.join(args.out, "init.h5"))
    model.train()  # dropout_rate 0: every Dropout is the identity
    check_spec(model, batches[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            foreach=False)
    losses = []
    for step, b in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        loss = batch_loss(model, b)
        loss.backward()
        if step == 0:
            with h5py.File(os.path.join(args.out, "step1_grads.h5"), "w") as f:
                for name, p in model.named_parameters():  # tied parameters appear once
                    f[f"grad/{name}"] = p.grad.detach().float().numpy()
                f.attrs["loss"] = loss.item()
        opt.step()
        losses.append(loss.item())
        if args.verbose:
            print(f"step {step + 1} loss {losses[-1]:.9g}", flush=True)
    write_weights(model, cfg, os.path.join(args.out, "final.h5"))
    import transformers
    result = {"config": args.config, "losses": losses, "steps": args.steps, "batch": args.batch,
              "source_len": args.source_len, "target_len": args.target_len, "eval_fraction": args.eval_fraction,
              "rows": n_rows, "train_rows": n_train, "seed": args.seed, "data": os.path.abspath(args.data),
              "model": CONFIGS[args.config], "transformers": transformers.__version__, "torch": torch.__version__}
    with open(os.path.join(args.out, "hf_losses.json"), "w") as f:
        json.dump(result, f)
        f.write("\n")
    with open(os.path.join(args.out, "buckets.json"), "w") as f:
        json.dump(buckets(args.config, args.source_len, args.target_len), f)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS))
    ap.add_argument("--data", help="JSON lines (t5_pairs.py)")
    ap.add_argument("--out", help="output folder (created)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="global batch")
    ap.add_argument("--source-len", type=int, default=64)
    ap.add_argument("--target-len", type=int, default=32)
    ap.add_argument("--eval-fraction", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--verbose", action="store_true", help="print every step's loss")
    ap.add_argument("--print-presets", action="store_true", help="the published models' dimensions (markdown)")
    ap.add_argument("--hf-count", action="store_true",
                    help="with --print-presets: also build each preset of at most --hf-count-limit parameters in HF "
                         "and count its state_dict")
    ap.add_argument("--hf-count-limit", type=float, default=1e9)
    ap.add_argument("--loss-of", nargs="+", metavar="FILE.h5",
                    help="print {file: HF's loss on the first training batch with its /model weights}")
    ap.add_argument("--generate", metavar="FILE.h5", help="print HF's greedy and beam outputs with FILE.h5's weights")
    ap.add_argument("--generate-n", type=int, default=8, help="with --generate: the first N validation rows")
    ap.add_argument("--generate-beams", type=int, default=4, help="with --generate: num_beams of the beam search")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.print_presets:
        print_presets(args.hf_count, args.hf_count_limit)
        return
    if not args.config or not args.data:
        ap.error("--config and --data are needed (or --print-presets)")
    if args.loss_of:
        loss_of(args)
        return
    if args.generate:
        generate_of(args)
        return
    if not args.out:
        ap.error("--out is needed")
    train(args)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
