"""How a Python suite reports its cases, and how tests/summary.py reads any suite's counts.

A suite makes one Report and calls check(name, ok, detail) per case (a PASS or FAIL line) and
skip(name, why) for a case that cannot run here (a SKIP line: counted apart, neither passed nor
failed). finish() prints the counts the way Boost.Test's short report does,
    "  N test cases out of M passed", "  N test cases out of M failed", "  N test cases out of M skipped"
(only the non-zero ones; M counts all three), which summary.py sums over the Boost.Test suites and
these alike, and returns the exit status: 1 when a case failed, 77 (meson's skip) when every case
was skipped, else 0."""
import re
import sys
import time

# Boost.Test's short report and finish() below: "  3 test cases out of 5 passed" ("passed with
# warnings" is a subset of passed, and not matched).
COUNT_LINE = re.compile(r"^\s*(\d+) test cases? out of \d+ (passed|failed|skipped|aborted)\s*$", re.M)


def counts(text):
    """{"passed": N, "failed": N, "skipped": N, "aborted": N} summed over the count lines in text."""
    out = {"passed": 0, "failed": 0, "skipped": 0, "aborted": 0}
    for n, what in COUNT_LINE.findall(text):
        out[what] += int(n)
    return out


def count_lines(passed, failed, skipped):
    total = passed + failed + skipped
    return [f"  {n} test case{'s' if n != 1 else ''} out of {total} {what}"
            for n, what in ((passed, "passed"), (failed, "failed"), (skipped, "skipped")) if n]


class Report:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.t0 = time.time()

    def check(self, name, ok, detail=""):
        """One case: PASS or FAIL (with detail). Returns ok."""
        ok = bool(ok)
        print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail != "" else ""), flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def skip(self, name, why):
        """A case that cannot run on this machine: a SKIP line saying why."""
        print(f"SKIP {name}: {why}", flush=True)
        self.skipped += 1

    def print_counts(self):
        for line in count_lines(self.passed, self.failed, self.skipped):
            print(line, flush=True)
        print(f"  ({time.time() - self.t0:.0f} s)", flush=True)

    def exit_code(self):
        if self.failed:
            return 1
        return 77 if self.skipped and not self.passed else 0

    def finish(self):
        """Prints the counts and exits with exit_code()."""
        self.print_counts()
        sys.exit(self.exit_code())
