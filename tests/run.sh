#!/usr/bin/env bash
# Installs what the project needs, builds it, runs every test suite, and ends with one line
# "N passed, N failed" (", N skipped" when any were) counting test cases: Boost.Test's and the Python
# suites' (tests/pylib/report.py), a test that reports none as one (tests/summary.py).
# Usage: bash tests/run.sh [BUILD_DIR] [extra meson test args]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true

if ! bash jobs/install-deps.sh --tests; then
  echo "run.sh: installing the packages failed (apt's lines above); next: fix what apt names (network, a held dpkg lock, disk space) and rerun bash tests/run.sh"
  echo "0 passed, 1 failed"
  exit 1
fi
# Configures $build with the tests forced on (reconfiguring a build/ that jobs/run-default.sh set
# up before Boost.Test was installed) and compiles it; a failure prints its error lines.
if ! bash jobs/build.sh --tests "$build"; then
  echo "0 passed, 1 failed"
  exit 1
fi
[ "${FSDP_CONFIGURE_ONLY:-0}" = 1 ] && exit 0  # tests/front_door: the configuration only

# As root on few cores: MPI tests run oversubscribed; one BLAS thread per rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# The PML Open MPI picks anyway, without opening the others first (tests/mpi_env.sh says why).
. tests/mpi_env.sh
meson test -C "$build" --print-errorlogs "$@"
rc=$?

/usr/bin/python3 tests/summary.py "$build/meson-logs/testlog.json"
summary_rc=$?
[ $rc -eq 0 ] && [ $summary_rc -eq 0 ]
