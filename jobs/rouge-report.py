#!/usr/bin/python3
"""ROUGE of `fsdp_app INPUT --generate N` output against its references, next to the lead
baseline (the first sentence of each source), with example summaries.

usage: jobs/rouge-report.py GENERATED.jsonl [--examples K] [--markdown]

Reads the JSON lines fsdp_app prints ({"index", "source", "reference", "generated"}; other
lines, e.g. mpirun's, are skipped). Scores with Google's rouge_score when it imports (pip
install rouge-score), else with the restatement below of its default tokenizer and F-measures
(rouge1, rouge2, rougeL, no stemmer: what fsdp_app's own metrics compute, train/rouge.cpp).
Prints the mean F-measures of both, the scorer used, and K examples.
"""
import argparse
import json
import re
import sys


def tokenize(text):
    return [t for t in re.split(r"\s+", re.sub(r"[^a-z0-9]+", " ", text.lower())) if re.match(r"^[a-z0-9]+$", t)]


def fmeasure(p, r):
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def ngram_f(ref, pred, n):
    def grams(t):
        out = {}
        for i in range(len(t) - n + 1):
            g = tuple(t[i:i + n])
            out[g] = out.get(g, 0) + 1
        return out
    r, p = grams(ref), grams(pred)
    overlap = sum(min(c, p.get(g, 0)) for g, c in r.items())
    return fmeasure(overlap / max(sum(p.values()), 1), overlap / max(sum(r.values()), 1))


def lcs(a, b):
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j in range(1, len(b) + 1):
            cur[j] = prev[j - 1] + 1 if x == b[j - 1] else max(prev[j], cur[j - 1])
        prev = cur
    return prev[-1]


def own_scores(reference, prediction):
    ref, pred = tokenize(reference), tokenize(prediction)
    rl = 0.0
    if ref and pred:
        n = lcs(ref, pred)
        rl = fmeasure(n / len(pred), n / len(ref))
    return {"rouge1": ngram_f(ref, pred, 1), "rouge2": ngram_f(ref, pred, 2), "rougeL": rl}


def scorer():
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        return "train/rouge.cpp's restatement (rouge_score not installed)", own_scores
    s = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    return "rouge_score", lambda ref, pred: {k: v.fmeasure for k, v in s.score(ref, pred).items()}


def lead(text):
    """The first sentence: up to the first . ! or ? followed by white space (or all of it)."""
    m = re.search(r"[.!?](\s|$)", text.strip())
    return text.strip()[:m.end()].strip() if m else text.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("generated")
    ap.add_argument("--examples", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for line in open(args.generated, encoding="utf-8", errors="replace"):
        if line.startswith("{"):
            rows.append(json.loads(line))
    if not rows:
        sys.exit(f"rouge-report: {args.generated}: no JSON lines from fsdp_app --generate")
    name, score = scorer()
    sums = {"generated": {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}, "lead": {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}}
    for r in rows:
        for who, text in (("generated", r["generated"]), ("lead", lead(r["source"]))):
            for k, v in score(r["reference"], text).items():
                sums[who][k] += v
    n = len(rows)
    print(f"{n} samples, scorer: {name}")
    print("| summary | ROUGE-1 | ROUGE-2 | ROUGE-L |")
    print("|---|---|---|---|")
    for who, label in (("generated", "fsdp_app --generate"), ("lead", "lead (first sentence)")):
        s = sums[who]
        print(f"| {label} | {s['rouge1'] / n:.4f} | {s['rouge2'] / n:.4f} | {s['rougeL'] / n:.4f} |")
    for r in rows[:args.examples]:
        print(f"\n[{r['index']}] reference: {r['reference']}\n    generated: {r['generated']}\n    lead:      {lead(r['source'])}")


if __name__ == "__main__":
    main()
