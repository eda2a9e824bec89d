#!/usr/bin/python3
"""Writes the seq2seq data set of the T5 reference check (tests/reference/check_t5.py) as JSON lines.

The entries of Debian's fortunes file (/usr/share/games/fortunes/fortunes, package fortunes-min)
are the texts between lines that hold only `%`, each with its trailing newlines stripped (the
file ends with a `%` line; the empty piece after it is not an entry). Row k is
{"text": entry[2k], "headline": entry[2k+1]}, for the first N rows (k = 0..N-1), in file order:
UTF-8 JSON, one object per line, keys in that order, non-ASCII characters written as they are.
A file with fewer than 2N entries gives every row it has (the note on stderr says how many);
Debian 12's file has 431 entries, 215 rows.

usage: t5_pairs.py OUT.jsonl [N=400] [--fortunes FILE]
"""
import argparse
import json
import sys

FORTUNES = "/usr/share/games/fortunes/fortunes"


def entries(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, cur = [], []
    for line in lines:
        if line == "%":
            out.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    tail = "\n".join(cur)
    if tail.strip("\n"):  # text after the last `%` line is an entry too
        out.append(tail)
    return [e.rstrip("\n") for e in out]


def pairs(path, n):
    e = entries(path)
    return [{"text": e[2 * k], "headline": e[2 * k + 1]} for k in range(min(n, len(e) // 2))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the JSON-lines file to write")
    ap.add_argument("n", nargs="?", type=int, default=400, help="rows (default 400)")
    ap.add_argument("--fortunes", default=FORTUNES)
    args = ap.parse_args()
    try:
        rows = pairs(args.fortunes, args.n)
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"t5_pairs.py: cannot read {args.fortunes}: {e}")
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    if len(rows) < args.n:
        print(f"t5_pairs.py: {args.fortunes} has {len(rows)} rows; wrote {len(rows)} of the {args.n} asked",
              file=sys.stderr)


if __name__ == "__main__":
    main()
