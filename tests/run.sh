#!/usr/bin/env bash
# Installs what the project needs, builds it, runs every test suite, and ends with one line
# "N passed, N failed" (", N skipped" when any were) counting test cases: Boost.Test's and the Python
# suites' (tests/pylib/report.py), a test that reports none as one (tests/summary.py).
# Usage: bash tests/run.sh [BUILD_DIR] [extra meson test args]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true

next_install="next: fix what apt names (network, a held dpkg lock, disk space) and rerun bash tests/run.sh"
if ! bash jobs/install-deps.sh --tests-build; then
  echo "run.sh: installing the packages failed (apt's lines above); $next_install"
  echo "0 passed, 1 failed"
  exit 1
fi
# What only running the tests needs (PyTorch, h5py, Slurm, ...; then the Hugging Face venv, from
# PyPI) installs while the build compiles: on a fresh machine that is most of the install's wall
# time, spent on downloads and dpkg rather than CPU. The venv is made ahead only to take it off the
# tests' clock: when it cannot be made, the tests that use it say why.
install_log=$(mktemp /tmp/run-install.XXXXXX)
(bash jobs/install-deps.sh --tests && { bash tests/reference/hf_venv.sh >/dev/null || true; }) >"$install_log" 2>&1 </dev/null &
install_pid=$!
# installed: waits for that install (every exit path does: no apt left running behind the
# script); when it failed, prints its last lines and what to do next, and fails.
installed() {
  if wait "$install_pid"; then
    rm -f "$install_log"
    return 0
  fi
  tail -20 "$install_log"
  echo "run.sh: installing the test packages failed (apt's lines above, all of them in $install_log); $next_install"
  return 1
}
# Configures $build with the tests forced on (reconfiguring a build/ that jobs/run-default.sh set
# up before Boost.Test was installed) and compiles it; a failure prints its error lines.
if ! bash jobs/build.sh --tests "$build"; then
  installed
  echo "0 passed, 1 failed"
  exit 1
fi
if ! installed; then
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
