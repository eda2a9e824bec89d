#!/usr/bin/python3
"""Prints the one line "N passed, N failed" for a `meson test` run (tests/run.sh, tests/sanitize.sh).

usage: summary.py BUILD_DIR/meson-logs/testlog.json
Counts Boost.Test cases ("N test cases out of M passed/failed/aborted" in a test's output; the
Python tests print the same lines) and, for a test that prints none, the whole test as one.
A test that failed (crash, timeout, sanitizer abort) after its report counts one failure more.
Exit status 1 when anything failed."""
import json
import re
import sys

passed = failed = 0
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = re.sub(r"\x1b\[[0-9;]*m", "", (t.get("stdout") or "") + "\n" + (t.get("stderr") or ""))
    p = sum(int(m) for m in re.findall(r"^\s*(\d+) test cases? out of \d+ passed", out, re.M))
    f = sum(int(m) for m in re.findall(r"^\s*(\d+) test cases? out of \d+ failed", out, re.M))
    # Also "N test cases out of M skipped"/aborted count as not passed.
    f += sum(int(m) for m in re.findall(r"^\s*(\d+) test cases? out of \d+ aborted", out, re.M))
    if t["result"] == "SKIP":  # exit 77: the test found nothing to run on (no GPU); neither count
        reason = next((l for l in out.splitlines() if l.startswith("SKIP")), "skipped")
        print(f"{t['name']}: {reason}", file=sys.stderr)
        continue
    ok = t["result"] in ("OK", "EXPECTEDFAIL")
    if p == 0 and f == 0:
        p, f = (1, 0) if ok else (0, 1)
    elif not ok and f == 0:
        f = 1  # crashed or timed out after its report
    passed += p
    failed += f
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
