#!/usr/bin/env bash
# Installs what the project needs, builds it, runs every test suite, and ends with one line
# "N passed, N failed" counting Boost.Test cases (and whole scripts for the script tests).
# Usage: bash tests/run.sh [BUILD_DIR] [extra meson test args]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true

bash jobs/install-deps.sh || { echo "install-deps failed"; echo "0 passed, 1 failed"; exit 1; }
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" >/dev/null || { echo "meson setup failed"; echo "0 passed, 1 failed"; exit 1; }
fi
if ! meson compile -C "$build" >"$build/compile.log" 2>&1; then
  tail -40 "$build/compile.log"
  echo "0 passed, 1 failed"
  exit 1
fi

# As root on few cores: MPI tests run oversubscribed; one BLAS thread per rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
meson test -C "$build" --print-errorlogs "$@"
rc=$?

/usr/bin/python3 - "$build/meson-logs/testlog.json" <<'PY'
import json, re, sys
passed = failed = 0
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = re.sub(r"\x1b\[[0-9;]*m", "", (t.get("stdout") or "") + "\n" + (t.get("stderr") or ""))
    p = sum(int(m) for m in re.findall(r"^\s*(\d+) test cases? out of \d+ passed", out, re.M))
    f = sum(int(m) for m in re.findall(r"^\s*(\d+) test cases? out of \d+ failed", out, re.M))
    # Also "N test cases out of M skipped"/aborted count as not passed.
    f += sum(int(m) for m in re.findall(r"^\s*(\d+) test cases? out of \d+ aborted", out, re.M))
    ok = t["result"] in ("OK", "EXPECTEDFAIL", "SKIP")
    if p == 0 and f == 0:
        p, f = (1, 0) if ok else (0, 1)
    elif not ok and f == 0:
        f = 1  # crashed or timed out after its report
    passed += p
    failed += f
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
summary_rc=$?
[ $rc -eq 0 ] && [ $summary_rc -eq 0 ]
