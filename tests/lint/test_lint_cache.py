#!/usr/bin/python3
"""The lint cache's keys (tests/lint/lint_cache.py) change with what the tools read and only with
that: a NOLINT comment in a header, a header's #if branch the preprocessor drops, a flag, the tool's
salt; not the checkout's path. split and record keep one tool's lines apart from another's.

usage: test_lint_cache.py     (needs clang++; prints a SKIP line and exits 77 without it)"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: pylib
from pylib.report import Report  # noqa: E402

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lint_cache.py")
if not shutil.which("clang++"):
    print("SKIP: no clang++ (the lint cache preprocesses with it)")
    sys.exit(77)

R = Report()
base = tempfile.mkdtemp(prefix="lint_cache_")


def checkout(name, header, flags="-O2"):
    """A tree ROOT/src/{a.cpp,a.h} with a compile database; returns (root, database path)."""
    root = os.path.join(base, name)
    os.makedirs(os.path.join(root, "src"), exist_ok=True)
    os.makedirs(os.path.join(root, "build"), exist_ok=True)
    with open(os.path.join(root, "src", "a.h"), "w") as f:
        f.write(header)
    with open(os.path.join(root, "src", "a.cpp"), "w") as f:
        f.write('#include "a.h"\nint f() { return g(); }\n')
    db = [{"directory": os.path.join(root, "build"), "file": os.path.join(root, "src", "a.cpp"),
           "command": f"c++ -I../src {flags} -MD -MQ a.o -MF a.o.d -o a.o -c ../src/a.cpp"}]
    path = os.path.join(root, "build", "db.json")
    with open(path, "w") as f:
        json.dump(db, f)
    return root, path


def key(root, db):
    out = os.path.join(root, "keys")
    subprocess.run([sys.executable, CACHE, "keys", db, root, "1", out], check=True)
    k, rel = open(out).read().split()
    assert rel == "src/a.cpp", rel
    return k


HEADER = "#pragma once\ninline int g() { return 1; }  // NOLINT(x)\n#if 0\nint unused;\n#endif\n"
first = key(*checkout("one", HEADER))
R.check("same tree at another path: same key", key(*checkout("elsewhere/two", HEADER)) == first, first[:12])
R.check("a NOLINT comment edited: new key", key(*checkout("c", HEADER.replace("NOLINT(x)", "NOLINT(y)"))) != first, "")
R.check("a dropped #if branch edited: new key", key(*checkout("d", HEADER.replace("unused", "unused2"))) != first, "")
R.check("a flag changed: new key", key(*checkout("e", HEADER, "-O3")) != first, "")
R.check("output paths ignored: same key",
        key(*checkout("f", HEADER, "-O2 -MD -MQ other.o")) == first, "-MD/-MQ are outputs")

# split and record: a unit recorded clean for one tool and salt is skipped for those only.
root, db = checkout("g", HEADER)
os.chdir(root)
key(root, db)
keys, manifest, todo, clean = (os.path.join(root, n) for n in ("keys", "clean.txt", "todo", "clean"))
with open(clean, "w") as f:
    f.write(os.path.join(root, "src", "a.cpp") + "\n")
subprocess.run([sys.executable, CACHE, "record", "clang-tidy", "salt", keys, clean, manifest], check=True)


def todo_count(tool, salt):
    return int(subprocess.run([sys.executable, CACHE, "split", tool, salt, keys, manifest, todo],
                              check=True, capture_output=True, text=True).stdout)


R.check("recorded unit skipped", todo_count("clang-tidy", "salt") == 0, "")
R.check("another salt (tool version, config) analyses", todo_count("clang-tidy", "salt2") == 1, "")
R.check("another tool analyses", todo_count("cppcheck", "salt") == 1, "")
open(clean, "w").close()
subprocess.run([sys.executable, CACHE, "record", "cppcheck", "salt", keys, clean, manifest], check=True)
R.check("recording one tool keeps the other's lines", todo_count("clang-tidy", "salt") == 0, "")

# The salt's "Host CPU:" line (clang-tidy --version) is the machine's, not the tool's: a recording
# made on one CPU holds on another; the version line next to it still counts.
tidy_version = "Debian LLVM version 14.0.6\n  Optimized build.\n  Host CPU: %s\n"
with open(clean, "w") as f:
    f.write(os.path.join(root, "src", "a.cpp") + "\n")
subprocess.run([sys.executable, CACHE, "record", "clang-tidy", tidy_version % "znver3", keys, clean, manifest], check=True)
R.check("another Host CPU skips", todo_count("clang-tidy", tidy_version % "rocketlake") == 0, "")
R.check("another version analyses", todo_count("clang-tidy", (tidy_version % "znver3").replace("14.0.6", "15.0.7")) == 1, "")

shutil.rmtree(base)
R.finish()
