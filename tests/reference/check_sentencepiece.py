#!/usr/bin/python3
"""Our SentencePiece tokenizer (data.tokenizer, src/data/sentencepiece.cpp) against Python's
sentencepiece and Hugging Face's T5Tokenizer, on a model that Debian's spm_train trains here.

1. spm_train (package sentencepiece) trains a unigram model with T5's ids (pad 0, eos 1, unk 2,
   no bos) and the default nmt_nfkc normalizer on three fortune files (computers, cookie, debian).
2. Encoding: the entries of other fortune files (fortunes, linux, science, people), which the
   model has not seen, and hand-made texts (NFKC forms, odd whitespace, characters the model lacks,
   literal "</s>", an empty text) give the same ids from our tokenizer (tests/reference/
   tokenize_tool) as from Python's sentencepiece 0.1.97 (python3-sentencepiece), every one.
3. Decoding: our decode equals T5Tokenizer(model, extra_ids=0, legacy=True).decode(ids[:first
   eos], skip_special_tokens=True) of transformers 4.36.2 (the venv of hf_venv.sh), on the ids of
   every text of step 2 and on 400 random id sequences rich in pad, eos and unk. Ours stops at the
   first eos (generation pads after it), so HF gets the ids up to it.

usage: check_sentencepiece.py PATH/TO/tokenize_tool OUT_DIR
OUT_DIR keeps the model, the requests and replies, and the logs. Exit 0 on PASS; otherwise the
last line is `check_sentencepiece: FAIL: ...` naming the first difference, exit 1.
"""
import json
import os
import random
import subprocess
import sys

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: pylib
from pylib.launch import Fail, run_logged  # noqa: E402
from pylib.report import Report  # noqa: E402
from pylib.venv import hf_python  # noqa: E402

FORTUNES = "/usr/share/games/fortunes"
TRAIN_FILES = ["computers", "cookie", "debian"]
TEXT_FILES = ["fortunes", "linux", "science", "people"]
VOCAB = 1000
RANDOM_SEQUENCES = 400
HAND_MADE = [
    "",
    " ",
    "Hello, world.",
    "  leading,  double   and trailing spaces  ",
    "tabs\tand\nnew\r\nlines",
    "He said , \"it isn't\" . Ok ? Yes !",
    "caf\u00e9 na\u00efve \u2014 \u201cquoted\u201d \u00bd \uff21\uff22\uff23 \u2460",  # NFKC folds the last three
    "snow \u2603 and \u6f22\u5b57 the model never saw",
    "literal </s> and <pad> and <unk> text",
    "x" * 3000,
]


def entries(name):
    """The fortune entries of one file (texts between % lines), as UTF-8 text."""
    with open(os.path.join(FORTUNES, name), encoding="utf-8") as f:
        return [e.strip("\n") for e in f.read().split("\n%\n") if e.strip()]


def ours(tool, model, requests, out):
    """tokenize_tool's replies to `requests` (one dict each)."""
    path = out + ".requests.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(path, "rb") as stdin:
        r = subprocess.run([tool, model], stdin=stdin, capture_output=True, timeout=600)
    if r.returncode != 0:
        raise Fail(f"tokenize_tool exited {r.returncode}: {r.stderr.decode(errors='replace').strip()[:300]}")
    with open(out, "wb") as f:
        f.write(r.stdout)
    replies = [json.loads(line) for line in r.stdout.decode("utf-8").splitlines()]
    if len(replies) != len(requests):
        raise Fail(f"tokenize_tool answered {len(replies)} of {len(requests)} requests")
    return replies


def hf_decode(model, sequences, out_dir):
    """T5Tokenizer.decode(seq, skip_special_tokens=True) for each sequence, in the HF venv."""
    python = hf_python()
    seq_path, text_path = os.path.join(out_dir, "hf_ids.json"), os.path.join(out_dir, "hf_texts.json")
    with open(seq_path, "w") as f:
        json.dump(sequences, f)
    script = (
        "import json, sys\n"
        "from transformers import T5Tokenizer\n"
        "tok = T5Tokenizer(sys.argv[1], extra_ids=0, legacy=True)\n"
        "seqs = json.load(open(sys.argv[2]))\n"
        "json.dump([tok.decode(s, skip_special_tokens=True) for s in seqs], open(sys.argv[3], 'w'))\n"
    )
    run_logged([python, "-c", script, model, seq_path, text_path], os.path.join(out_dir, "hf_decode.log"), timeout=600)
    with open(text_path) as f:
        return json.load(f)


def check(tool, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    prefix = os.path.join(out_dir, "fortunes")
    inputs = ",".join(os.path.join(FORTUNES, n) for n in TRAIN_FILES)
    run_logged(["spm_train", f"--input={inputs}", f"--model_prefix={prefix}", f"--vocab_size={VOCAB}",
         "--model_type=unigram", "--pad_id=0", "--eos_id=1", "--unk_id=2", "--bos_id=-1", "--num_threads=2"],
        os.path.join(out_dir, "spm_train.log"), timeout=600)
    model = prefix + ".model"
    sp = spm.SentencePieceProcessor(model_file=model)
    if (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) != (0, 1, 2, -1):
        raise Fail(f"spm_train gave pad {sp.pad_id()}, eos {sp.eos_id()}, unk {sp.unk_id()}, bos {sp.bos_id()}")

    texts = [t for name in TEXT_FILES for t in entries(name)] + HAND_MADE
    replies = ours(tool, model, [{"text": t} for t in texts], os.path.join(out_dir, "encode.jsonl"))
    python_ids = [sp.encode(t) for t in texts]
    for t, mine, theirs in zip(texts, replies, python_ids):
        if mine["ids"] != theirs:
            raise Fail(f"ids differ for {t[:80]!r}: ours {mine['ids'][:20]}..., Python's {theirs[:20]}...")
    if sum(2 in ids for ids in python_ids) == 0:
        raise Fail("no text has an unknown piece: the check would not see unk handled")

    rng = random.Random(17)
    sequences = list(python_ids)
    for _ in range(RANDOM_SEQUENCES):
        seq = [rng.choice([0, 1, 2]) if rng.random() < 0.15 else rng.randrange(3, VOCAB)
               for _ in range(rng.randrange(0, 40))]
        sequences.append(seq)
    decoded = ours(tool, model, [{"ids": s} for s in sequences], os.path.join(out_dir, "decode.jsonl"))
    up_to_eos = [s[:s.index(1)] if 1 in s else s for s in sequences]
    hf = hf_decode(model, up_to_eos, out_dir)
    for seq, mine, theirs in zip(sequences, decoded, hf):
        if mine["text"] != theirs:
            raise Fail(f"decode differs for {seq[:20]}: ours {mine['text']!r}, HF's {theirs!r}")
    return (f"{len(texts)} texts encode to Python sentencepiece's ids ({sum(map(len, python_ids))} ids, model of "
            f"{sp.get_piece_size()} pieces); {len(sequences)} id sequences decode as HF T5Tokenizer's "
            f"decode(skip_special_tokens=True)")


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().split("\n\n")[-2], file=sys.stderr)
        return 2
    r = Report()
    try:
        verdict = "PASS: " + check(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]))
        r.check("ids and decoding equal Python sentencepiece's and HF's", True)
    except Fail as e:
        verdict = f"FAIL: {e}"
        r.check("ids and decoding equal Python sentencepiece's and HF's", False, str(e))
    r.print_counts()
    print(f"check_sentencepiece: {verdict}")
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
