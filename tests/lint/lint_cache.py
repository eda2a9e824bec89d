#!/usr/bin/env python3
"""Which translation units lint must analyse again: a key per (tool, translation unit).

clang-tidy and cppcheck look at one translation unit at a time, and what they report depends on
nothing but that unit's text, its compile flags, the tool's version and configuration. So a unit
whose key is recorded in tests/lint/clean.txt (a run found nothing in it) needs no new run, as a
compiler cache reuses an object file. The key covers:
  - the compile command (flags; paths under the checkout and $HOME written relative, so a clone
    elsewhere gets the same keys; the database must not use -march=native, which would tie it to
    the CPU: tests/lint.sh configures build-lint without it);
  - the unit preprocessed by clang++ -E -C (comments kept: a NOLINT is a comment), which holds
    every header's active text, system headers included (a package update changes the key);
  - the raw bytes of every file of ours that the unit includes, #if branches not taken included
    (cppcheck reads those too);
  - the tool's salt: its --version (but clang-tidy's "Host CPU:" line), its configuration files
    and its command-line options.
Usage (tests/lint.sh runs these):
  lint_cache.py keys DB ROOT JOBS KEYS        one line "unit_key path" per entry of DB (a compile
                                              database with absolute paths; paths relative to ROOT)
  lint_cache.py split TOOL SALT KEYS MANIFEST TODO
                                              writes to TODO the absolute paths of the units whose
                                              key for TOOL is not in MANIFEST; prints how many are
  lint_cache.py record TOOL SALT KEYS CLEAN MANIFEST
                                              rewrites TOOL's lines of MANIFEST: one per unit of
                                              KEYS listed in CLEAN (absolute paths, one a line)
A unit that does not preprocess gets no key and is always analysed.
"""
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

# Flags that name outputs or colour: not part of what the tools analyse.
DROP_WITH_VALUE = {"-o", "-MQ", "-MF", "-MT"}
DROP = {"-c", "-MD", "-MMD", "-fdiagnostics-color=always", "-Winvalid-pch"}


def normalise(text, root, home):
    text = text.replace(root, "<root>")
    return text.replace(home, "<home>") if home and home != "/" else text


def analysed_args(entry):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    kept, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in DROP_WITH_VALUE:
            skip = True
        elif a not in DROP and a != entry["file"] and os.path.normpath(os.path.join(entry["directory"], a)) != entry["file"]:
            kept.append(a)
    return kept


def unit_key(entry, root, home):
    args = analysed_args(entry)
    digest = hashlib.sha256()
    digest.update(b"args\0" + normalise(" ".join(args), root, home).encode())
    # -Wno-unknown-warning-option: the database holds GCC's flags; clang says nothing about them.
    cmd = ["clang++", *args, "-Wno-unknown-warning-option", "-E", "-C", entry["file"]]
    run = subprocess.run(cmd, cwd=entry["directory"], capture_output=True)
    if run.returncode != 0:
        return None  # does not preprocess: the tools run on it and say why
    text = run.stdout.decode("utf-8", "replace")
    digest.update(b"\0pre\0" + normalise(text, root, home).encode())
    ours = set()
    for m in re.finditer(r'^# \d+ "([^"]+)"', text, re.M):
        path = os.path.normpath(os.path.join(entry["directory"], m.group(1)))
        if path.startswith(root + os.sep) and os.path.isfile(path):
            ours.add(path)
    for path in sorted(ours):
        with open(path, "rb") as f:
            digest.update(b"\0file\0" + os.path.relpath(path, root).encode() + b"\0" + f.read())
    return digest.hexdigest()


def tool_key(tool, salt, unit):
    root = os.path.realpath(".")
    home = os.path.realpath(os.path.expanduser("~"))
    # clang-tidy --version names the CPU it runs on ("Host CPU: znver3"): that line says nothing
    # of the analysis (the database has no -march=native), and kept in the salt it made every key
    # change with the machine, so lint on a machine of another kind analysed all units again.
    salt = re.sub(r"^\s*Host CPU:.*$", "", salt, flags=re.M)
    return hashlib.sha256(f"{tool}\0{normalise(salt, root, home)}\0{unit}".encode()).hexdigest()


def read_keys(path):
    units = []  # (unit key or None, path relative to the root)
    for line in open(path):
        k, rel = line.rstrip("\n").split(" ", 1)
        units.append((None if k == "none" else k, rel))
    return units


HEADER = """\
# Translation units in which lint found nothing, one line per tool and unit: "tool key path".
# tests/lint.sh analyses again only the units whose key is not here (tests/lint/lint_cache.py
# says what a key covers). Written by `LINT_RECORD=1 bash tests/lint.sh`; commit it with the change.
"""


def read_manifest(path):
    try:
        return [line.rstrip("\n") for line in open(path) if line.strip() and not line.startswith("#")]
    except FileNotFoundError:
        return []


def main():
    args = sys.argv[1:]
    if args[:1] == ["keys"] and len(args) == 5:
        db_path, root, jobs, out = args[1:]
        root = os.path.realpath(root)
        home = os.path.realpath(os.path.expanduser("~"))
        entries = json.load(open(db_path))
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
            keys = list(pool.map(lambda e: unit_key(e, root, home), entries))
        with open(out, "w") as f:
            for entry, k in zip(entries, keys):
                f.write(f"{k or 'none'} {os.path.relpath(entry['file'], root)}\n")
    elif args[:1] == ["split"] and len(args) == 6:
        tool, salt, keys, manifest, todo = args[1:]
        recorded = set(read_manifest(manifest))
        todo_paths = [os.path.realpath(rel) for k, rel in read_keys(keys)
                      if k is None or f"{tool} {tool_key(tool, salt, k)} {rel}" not in recorded]
        with open(todo, "w") as f:
            f.writelines(p + "\n" for p in todo_paths)
        print(len(todo_paths))
    elif args[:1] == ["record"] and len(args) == 6:
        tool, salt, keys, clean, manifest = args[1:]
        clean_paths = {os.path.relpath(os.path.realpath(line.strip())) for line in open(clean) if line.strip()}
        units = read_keys(keys)
        current = {rel for _, rel in units}
        # Other tools' lines stay, but only for units that still exist.
        kept = [line for line in read_manifest(manifest)
                if not line.startswith(tool + " ") and line.split(" ", 2)[2] in current]
        new = [f"{tool} {tool_key(tool, salt, k)} {rel}" for k, rel in units if k is not None and rel in clean_paths]
        body = sorted(kept + new, key=lambda line: (line.split(" ", 2)[2], line.split(" ")[0]))
        with open(manifest, "w") as f:
            f.write(HEADER + "".join(line + "\n" for line in body))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
