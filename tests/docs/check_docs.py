#!/usr/bin/python3
"""Checks that what README.md and docs/*.md show as code still matches the repository.

usage: check_docs.py FSDP_APP FSDP_BENCH FSDP_CKPT      (Debian's /usr/bin/python3, stdlib only)

From every fenced or indented code block and every inline `code` span of README.md and
docs/*.md (HTML comments left out) it checks:
  paths    every repository-relative path under jobs/ tests/ input/ apps/ src/ docs/ exists
           (a glob must match something; a path cut at a placeholder such as <target> is checked
           up to it), and every relative Markdown link points at an existing file (and heading)
  options  every --long-option given to fsdp_app, fsdp_bench or fsdp_ckpt (the words after the
           program's name in a command) appears in that program's --help output
  keys     every dotted input key (model. data. train. fsdp. comm. checkpoint. output.
           generate.) used with --set key=value, shown in a ```yaml block, or shown in a code span
           as `key`, `key: value` or `section: {flow: map}` appears in docs/input-file.md; when
           that file does not exist the check is skipped with a note
Prints one line per problem, FILE:LINE: what, then Boost.Test-style summary lines (one test case
per document) that tests/summary.py counts; exit status 1 on any problem.
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH_PREFIXES = ("jobs", "tests", "input", "apps", "src", "docs")
SECTIONS = ("model", "data", "train", "fsdp", "comm", "checkpoint", "output", "generate")
PROGRAMS = ("fsdp_app", "fsdp_bench", "fsdp_ckpt")
# A dotted word whose last part is one of these is a file name (model.safetensors), not a key.
FILE_SUFFIXES = {"safetensors", "json", "jsonl", "h5", "yaml", "yml", "csv", "md", "py", "sh", "png", "txt",
                 "model", "bin", "pt", "tmp", "supp", "cpp", "h", "cu", "sbatch"}

PATH_RE = re.compile(r"(?<![\w./~$-])((?:%s)/[^\s'\"`()<>\[\]{},;|]*)" % "|".join(PATH_PREFIXES))
KEY_RE = r"(?:%s)(?:\.[A-Za-z_{][\w{},]*)+" % "|".join(SECTIONS)
SET_RE = re.compile(r"--set(?:\s+|=)['\"]?(%s)=" % KEY_RE)
SPAN_KEY_RE = re.compile(r"^(%s)\s*(?:[:=].*)?$" % KEY_RE, re.S)
SPAN_FLOW_RE = re.compile(r"^(%s)\s*:\s*(\{.*\})\s*$" % "|".join(SECTIONS), re.S)
LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


class Item:
    """A piece of code from a document: kind 'block' (with lang) or 'span', its text, first line."""

    def __init__(self, kind, text, line, lang=""):
        self.kind, self.text, self.line, self.lang = kind, text, line, lang


def strip_html_comments(text):
    # Keep the newlines so line numbers stay right.
    return re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


LIST_RE = re.compile(r"^(\s*)([-*+]|\d+[.)])(\s+)")


def parse(text):
    """Returns (items, paragraphs): code items, and prose paragraphs as (first line, text)."""
    lines = strip_html_comments(text).split("\n")
    items, paragraphs = [], []
    fence = None  # (marker, lang, start line, lines)
    indented = None  # (start line, lines)
    para = None  # (start line, lines)
    list_cols = []  # content columns of the open list items
    prev_blank = True

    def end_para():
        nonlocal para
        if para:
            paragraphs.append((para[0], "\n".join(para[1])))
        para = None

    def end_indented():
        nonlocal indented
        if indented:
            body = indented[1]
            while body and not body[-1].strip():
                body.pop()
            items.append(Item("block", "\n".join(body), indented[0]))
        indented = None

    for n, line in enumerate(lines, 1):
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if fence:
            if stripped.startswith(fence[0]) and not stripped[len(fence[0]):].strip(fence[0][0]).strip():
                items.append(Item("block", "\n".join(fence[3]), fence[2], fence[1]))
                fence = None
            else:
                fence[3].append(line)
            continue
        if not stripped:
            end_para()
            if indented:
                indented[1].append("")
            prev_blank = True
            continue
        if prev_blank:
            while list_cols and indent < list_cols[-1]:
                list_cols.pop()
        base = list_cols[-1] if list_cols else 0
        if indented and indent >= base + 4:
            indented[1].append(line[base + 4:])
            prev_blank = False
            continue
        end_indented()
        m = re.match(r"(`{3,}|~{3,})\s*([\w+-]*)", stripped)
        if m:
            end_para()
            fence = (m.group(1), m.group(2).lower(), n + 1, [])
            prev_blank = False
            continue
        if prev_blank and indent >= base + 4 and not para:
            indented = (n, [line[base + 4:]])
            prev_blank = False
            continue
        lm = LIST_RE.match(line)
        if lm:
            end_para()
            while list_cols and list_cols[-1] > indent:
                list_cols.pop()
            list_cols.append(len(lm.group(0)))
        elif prev_blank and indent == 0:
            list_cols = []
        if para is None:
            para = (n, [])
        para[1].append(line)
        prev_blank = False
    end_para()
    end_indented()
    if fence:
        items.append(Item("block", "\n".join(fence[3]), fence[2], fence[1]))
    for first, ptext in paragraphs:
        for m in re.finditer(r"(`+)(.+?)(?<!`)\1(?!`)", ptext, re.S):
            line = first + ptext.count("\n", 0, m.start())
            items.append(Item("span", re.sub(r"\s*\n\s*", " ", m.group(2)).strip(), line))
    return items, paragraphs


def line_of(item, offset):
    if item.kind == "span":
        return item.line
    return item.line + item.text.count("\n", 0, offset)


# ---- paths -------------------------------------------------------------------------------------

def check_path(p):
    """None when the path exists, else why not."""
    p = p.rstrip(".,:;")
    if p.endswith("/..."):
        p = p[:-4]
    if "..." in p:
        p = p.split("...")[0]
    if any(c in p for c in "*?"):
        return None if glob.glob(os.path.join(ROOT, p)) else "matches nothing"
    return None if os.path.exists(os.path.join(ROOT, p)) else "does not exist"


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        return set()
    out = set()
    in_fence = False
    for line in text.split("\n"):
        if re.match(r"\s*(```|~~~)", line):
            in_fence = not in_fence
        elif not in_fence:
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                out.add(slug(m.group(1)))
    return out


# ---- options -----------------------------------------------------------------------------------

def commands(text):
    """Splits code into commands: backslash continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", text)
    for line in text.split("\n"):
        line = re.sub(r"(^|\s)#.*$", "", line)
        for part in re.split(r"\s(?:\|\||\||&&|;)\s|;\s*$", line):
            if part.strip():
                yield part


def program_options(cmd):
    """(program, [--options]) for the first fsdp program named in cmd, else None."""
    words = cmd.split()
    for i, w in enumerate(words):
        name = os.path.basename(w.strip("[]()'\"$"))
        if name in PROGRAMS:
            opts = []
            for x in words[i + 1:]:
                m = re.match(r"^[\[('\"]*(--[A-Za-z][\w-]*)", x)
                if m:
                    opts.append(m.group(1))
            return name, opts
    return None


def help_options(binary):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run([binary, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                       timeout=120, check=False)
    out = r.stdout.decode("utf-8", "replace")
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {out.strip()[-300:]}")
    return set(re.findall(r"--[A-Za-z][\w-]*", out)) | {"--help"}


# ---- keys --------------------------------------------------------------------------------------

def expand_braces(key):
    m = re.search(r"\{([^{}]*)\}", key)
    if not m:
        return [key]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(key[:m.start()] + alt.strip() + key[m.end():])
    return out


def flow_keys(s, prefix):
    """Dotted keys of the YAML flow mapping s ('{a: 1, b: {c: 2}}') under prefix."""
    keys = []
    i = 0

    def skip_ws():
        nonlocal i
        while i < len(s) and s[i].isspace():
            i += 1

    def scalar_end(j):
        depth, quote = 0, None
        while j < len(s):
            c = s[j]
            if quote:
                if c == quote:
                    quote = None
            elif c in "'\"":
                quote = c
            elif c in "[{":
                depth += 1
            elif c in "]}":
                if depth == 0:
                    return j
                depth -= 1
            elif c == "," and depth == 0:
                return j
            j += 1
        return j

    def mapping(pre):
        nonlocal i
        i += 1  # '{'
        while True:
            skip_ws()
            if i >= len(s) or s[i] == "}":
                i += 1
                return
            m = re.match(r"([\w-]+)\s*:\s*", s[i:])
            if not m:  # not a mapping after all: skip to its end
                i = scalar_end(i) + 1
                continue
            key = pre + "." + m.group(1)
            i += m.end()
            if i < len(s) and s[i] == "{":
                mapping(key)
            else:
                i = scalar_end(i)
                keys.append(key)
            skip_ws()
            if i < len(s) and s[i] == ",":
                i += 1

    skip_ws()
    if i < len(s) and s[i] == "{":
        mapping(prefix)
    return keys


def yaml_keys(text):
    """(line offset, dotted key) of every leaf of a YAML block (block and flow mappings)."""
    out = []
    stack = []  # (indent, key)
    pending = None  # (indent, key, offset): a `key:` with no value yet
    lines = text.split("\n")
    k = 0
    while k < len(lines):
        raw = lines[k]
        offset = k
        k += 1
        if raw.lstrip().startswith("#"):
            continue
        s = re.sub(r"\s+#.*$", "", raw)
        if not s.strip():
            continue
        indent = len(s) - len(s.lstrip())
        t = s.strip()
        if pending and indent <= pending[0]:
            out.append((pending[2], pending[1]))
        if pending and indent > pending[0]:
            stack.append((pending[0], pending[1]))
        pending = None
        while stack and indent <= stack[-1][0]:
            stack.pop()
        if t.startswith("- ") or t == "-":
            continue
        m = re.match(r"([\w-]+)\s*:(?:\s+(.*))?$", t)
        if not m:
            continue
        key = ".".join([x[1] for x in stack] + [m.group(1)])
        value = (m.group(2) or "").strip()
        if not value:
            pending = (indent, key, offset)
        elif value.startswith("{"):
            while value.count("{") > value.count("}") and k < len(lines):  # a flow map over lines
                value += " " + re.sub(r"\s+#.*$", "", lines[k]).strip()
                k += 1
            out += [(offset, x) for x in flow_keys(value, key)]
        else:
            out.append((offset, key))
    if pending:
        out.append((pending[2], pending[1]))
    return out


def keys_of(item):
    """(offset, key) pairs an item shows."""
    found = []
    for m in SET_RE.finditer(item.text):
        found.append((m.start(), m.group(1)))
    if item.kind == "block" and item.lang in ("yaml", "yml"):
        lines = item.text.split("\n")
        for off, key in yaml_keys(item.text):
            found.append((sum(len(x) + 1 for x in lines[:off]), key))
    if item.kind == "span":
        m = SPAN_FLOW_RE.match(item.text)
        if m:
            found += [(0, k) for k in flow_keys(m.group(2), m.group(1))]
        else:
            m = SPAN_KEY_RE.match(item.text)
            if m:
                found.append((0, m.group(1)))
    out = []
    for off, key in found:
        if key.split(".")[-1].lower() in FILE_SUFFIXES:
            continue
        if key.split(".")[0] not in SECTIONS:
            continue
        out += [(off, k) for k in expand_braces(key)]
    return out


def key_known(key, reference):
    return re.search(r"(?<![\w.])" + re.escape(key) + r"(?![\w])", reference) is not None


# ---- main --------------------------------------------------------------------------------------

def main(argv):
    if len(argv) != 4:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    binaries = {}
    for i, path in enumerate(argv[1:]):
        name = os.path.basename(path)
        binaries[name if name in PROGRAMS else PROGRAMS[i]] = path
    problems_total = 0
    extra_failed = 0
    helps = {}
    for name in PROGRAMS:
        try:
            helps[name] = help_options(binaries[name])
        except (OSError, RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
            print(f"{binaries.get(name, name)}: --help failed: {e}")
            extra_failed += 1
            problems_total += 1

    docs = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    reference_path = os.path.join(ROOT, "docs", "input-file.md")
    reference = open(reference_path, encoding="utf-8").read() if os.path.exists(reference_path) else None
    if reference is None:
        print("note: docs/input-file.md does not exist (yet): input keys not checked")

    counts = {"paths": 0, "links": 0, "options": 0, "keys": 0}
    passed = failed = 0
    anchor_cache = {}
    for doc in docs:
        rel = os.path.relpath(doc, ROOT)
        try:
            items, paragraphs = parse(open(doc, encoding="utf-8").read())
        except (OSError, UnicodeDecodeError) as e:
            print(f"{rel}:1: cannot read: {e}")
            failed += 1
            problems_total += 1
            continue
        problems = []
        for item in items:
            for m in PATH_RE.finditer(item.text):
                counts["paths"] += 1
                why = check_path(m.group(1))
                if why:
                    problems.append((line_of(item, m.start()), f"path {m.group(1).rstrip('.,:;')} {why}"))
            for cmd in commands(item.text):
                po = program_options(cmd)
                if not po or po[0] not in helps:
                    continue
                for opt in po[1]:
                    counts["options"] += 1
                    if opt not in helps[po[0]]:
                        off = item.text.find(opt)
                        problems.append((line_of(item, max(off, 0)),
                                         f"{po[0]} has no option {opt} (not in its --help)"))
            if reference is not None:
                for off, key in keys_of(item):
                    counts["keys"] += 1
                    if not key_known(key, reference):
                        problems.append((line_of(item, off), f"input key {key} is not in docs/input-file.md"))
        for first, ptext in paragraphs:
            # Links in prose, code spans blanked out first.
            prose = re.sub(r"(`+)(.+?)(?<!`)\1(?!`)", lambda m: re.sub(r"[^\n]", " ", m.group(0)), ptext, flags=re.S)
            for m in LINK_RE.finditer(prose):
                target = m.group(1)
                if re.match(r"^[a-z][\w+.-]*:", target) or target.startswith("#"):
                    continue
                counts["links"] += 1
                line = first + prose.count("\n", 0, m.start())
                path, _, frag = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(doc), path))
                if not os.path.exists(full):
                    problems.append((line, f"link {target}: {os.path.relpath(full, ROOT)} does not exist"))
                elif frag and full.endswith(".md"):
                    if full not in anchor_cache:
                        anchor_cache[full] = anchors(full)
                    if frag not in anchor_cache[full]:
                        problems.append((line, f"link {target}: no heading #{frag} in {os.path.relpath(full, ROOT)}"))
        for line, what in sorted(set(problems)):
            print(f"{rel}:{line}: {what}")
        problems_total += len(set(problems))
        if problems:
            failed += 1
        else:
            passed += 1

    total = passed + failed + extra_failed
    failed += extra_failed
    print(f"checked {len(docs)} documents: {counts['paths']} paths, {counts['links']} links, "
          f"{counts['options']} options, {counts['keys']} input keys; {problems_total} problem(s)")
    if failed:
        print(f'*** {problems_total} problem(s) detected in the test module "docs"')
        print(f'Test module "docs" has failed with:')
    else:
        print(f'Test module "docs" has passed with:')
    print(f"  {passed} test case{'s' if passed != 1 else ''} out of {total} passed")
    if failed:
        print(f"  {failed} test case{'s' if failed != 1 else ''} out of {total} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
