#!/usr/bin/env bash
# Installs what the project needs, builds it, runs every test suite, and ends with one line
# "N passed, N failed" counting Boost.Test cases (and whole scripts for the script tests).
# Usage: bash tests/run.sh [BUILD_DIR] [extra meson test args]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true

bash jobs/install-deps.sh --tests || { echo "install-deps failed"; echo "0 passed, 1 failed"; exit 1; }
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

/usr/bin/python3 tests/summary.py "$build/meson-logs/testlog.json"
summary_rc=$?
[ $rc -eq 0 ] && [ $summary_rc -eq 0 ]
