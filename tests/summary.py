#!/usr/bin/python3
"""Prints the one line "N passed, N failed" (", N skipped" when any were) for a `meson test` run
(tests/run.sh, tests/sanitize.sh; .ci/run's count reads the first two fields).

usage: summary.py BUILD_DIR/meson-logs/testlog.json
Counts test cases from the "N test cases out of M passed/failed/skipped/aborted" lines in a test's
output: Boost.Test's short report prints them, and so do the Python suites (pylib/report.py) and
the shell tests. A test that prints none counts as one case: passed, failed, or skipped (exit 77:
it found nothing to run on, e.g. no GPU or not root; its SKIP line goes to stderr here). Skipped
cases are neither passed nor failed. Aborted ones count as failed, and a test that failed (crash,
timeout, sanitizer abort) without reporting a failure counts one failure more.
Exit status 1 when anything failed."""
import json
import re
import sys

from pylib.report import counts

passed = failed = skipped = 0
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = re.sub(r"\x1b\[[0-9;]*m", "", (t.get("stdout") or "") + "\n" + (t.get("stderr") or ""))
    c = counts(out)
    p, f, s = c["passed"], c["failed"] + c["aborted"], c["skipped"]
    if t["result"] == "SKIP":  # exit 77: nothing here to run on; the reason on stderr
        reason = next((l for l in out.splitlines() if l.startswith("SKIP")), "skipped")
        print(f"{t['name']}: {reason}", file=sys.stderr)
        skipped += s or 1
        passed += p
        failed += f
        continue
    ok = t["result"] in ("OK", "EXPECTEDFAIL")
    if p == 0 and f == 0 and s == 0:
        p, f = (1, 0) if ok else (0, 1)
    elif not ok and f == 0:
        f = 1  # crashed or timed out after its report
    passed += p
    failed += f
    skipped += s
print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
sys.exit(1 if failed else 0)
