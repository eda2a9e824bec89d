#!/usr/bin/env bash
# The C++ and MPI test suites under AddressSanitizer (+ LeakSanitizer) and
# UndefinedBehaviorSanitizer. Configures BUILD_DIR (default build-asan) with clang,
# -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized (-O2, -gline-tables-only, asserts on;
# the test executables' own sources at -O0, -D(mpi_)tests_optimization=0: a Boost.Test file at -O2
# under the sanitizers costs minutes, and the code under test keeps -O2; the library's units that
# parse, write, register and compose at -O0 too, -Dcold_optimization=0, see below) and -Dfuzz=enabled
# (the libFuzzer targets too, for .ci/run's fuzz stage), compiles it,
# runs `meson test` with the sanitizer environment below, and ends like tests/run.sh with one
# line "N passed, N failed" (", N skipped" when any were; tests/summary.py).
# Usage: bash tests/sanitize.sh [BUILD_DIR] [extra meson test args]; SANITIZE_BUILD_ONLY=1 only
# configures and compiles; SANITIZE_TESTS_ONLY=1 only runs the tests of a build made so.
# Without extra arguments it runs every suite but e2e, mpi_more, mpi_np1 and cli (unit, app, mpi,
# fuzz replays: every Boost.Test suite and every MPI suite, the MPI ones at world size 3 and the
# small ones at 1 too; np 2, 4, 5 and 8, suite mpi_more, run in the release build: under ASan np
# 2, 4, 5 added ~100 s and np 8 ~130 s; np 3 gives the uneven splits and odd rings; comm and
# engine_streams at np 1, suite mpi_np1, 28 s under ASan, run in the release build too, their
# one-rank shortcuts instrumented in the single-process suites; cli, the apps' argv errors, runs in
# the release build too: 85 s under ASan in CI for parsing that test_app runs instrumented). The e2e scripts (torch reference, FSDP equivalence,
# checkpoints end to end, multihost, Slurm, fault injection) run once, in the release build of
# tests/run.sh; `bash tests/sanitize.sh build-asan --suite e2e` runs them here too (about 40
# minutes on 2 cores).
#
# What a finding does: ASan/LSan abort the process (abort_on_error=1); meson.build adds
# -fno-sanitize-recover=undefined when b_sanitize has `undefined`, so every UBSan finding aborts
# too. A sanitized rank that aborts fails its mpirun, and so the test. Reports go to the test's
# stderr (meson-logs/testlog.txt; the Python tests print the failing run's stderr tail).
#
# Only our executables are instrumented (fsdp_app, fsdp_ckpt, the Boost.Test suites, probes);
# /usr/bin/python3, mpirun, torch etc. are not, and ignore these variables. The Python tests launch
# the instrumented fsdp_app of BUILD_DIR: through plain mpirun the ranks inherit this environment
# (same host); tests/multihost forwards the *SAN_OPTIONS and UCX_* variables with mpirun -x (its
# rsh agent starts the remote side from a bare environment, as ssh does); sbatch/srun in
# tests/slurm export the submitting environment (--export=ALL, Slurm's default).
#
# Environment:
#   ASAN_OPTIONS   detect_leaks=1: LeakSanitizer at exit. abort_on_error=1: SIGABRT, never a
#                  plain exit code a test might expect. The fast (frame-pointer) unwinder at
#                  malloc, ASan's default: fast_unwind_on_malloc=0 unwound every allocation's
#                  stack with DWARF, and a sanitized 2-rank training run took 7.3 user-s with it,
#                  2.6 without; stacks through OpenMPI (built without frame pointers) then end in
#                  its library, which lsan.supp matches by module. intercept_tls_get_addr=0:
#                  libasan 12 misreads glibc 2.36's dynamic TLS blocks (google/sanitizers#1322) and LeakSanitizer's tracer then crashes
#                  ("Tracer caught signal 11", seen with tests/fuzz's replay_ckpt_*); our TLS is
#                  static (in the executable) and still scanned. check_initialization_order /
#                  strict_init_order: static initialisation order bugs. detect_stack_use_after_return
#                  stays off (2-3x slower and the suite is long).
#   UBSAN_OPTIONS  print_stacktrace=1:halt_on_error=1 (belt and braces with -fno-sanitize-recover).
#   LSAN_OPTIONS   suppressions=tests/sanitizers/lsan.supp: allocations that the MPI stack
#                  (OpenMPI, PMIx, hwloc, UCX) keeps until exit, each line explained there.
#                  Nothing in our code is suppressed.
#   LD_PRELOAD     $BUILD_DIR/libkeep_loaded.so (tests/sanitizers/keep_loaded.c): dlclose keeps the
#                  library loaded, so Open MPI's plugins outlive MPI_Finalize and LeakSanitizer
#                  does not re-read /proc/self/maps for each of their blocks at exit.
#   UCX_*          see below, where they are set.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-build-asan}
shift || true

fail() { echo "$1"; echo "0 passed, 1 failed"; exit 1; }

t0=$(date +%s)
# SANITIZE_TESTS_ONLY=1: the build is done (.ci/run compiled it with SANITIZE_BUILD_ONLY=1 and
# fuzzes it in the background meanwhile: no second ninja may run in it).
if [ "${SANITIZE_TESTS_ONLY:-0}" = 1 ]; then
  [ -f "$build/build.ninja" ] || fail "$build is not configured (SANITIZE_TESTS_ONLY=1 needs a build made by SANITIZE_BUILD_ONLY=1)"
else
  # A build only (.ci/run's background compile) needs only what compiling needs: the packages that
  # only running the e2e tests needs install meanwhile, from tests/run.sh.
  deps=--tests
  [ "${SANITIZE_BUILD_ONLY:-0}" = 1 ] && deps=--tests-build
  bash jobs/install-deps.sh "$deps" || fail "install-deps failed"
  # -gline-tables-only (after the buildtype's -g, so it wins): file:line in every sanitizer report,
  # without the full debug info nobody reads in CI; measured with clang 14 on trainer.cpp and
  # fsdp_app.cpp under these flags: 12.4 -> 11.7 and 24.3 -> 20.9 CPU-s.
  # -Dapps_optimization=0: the apps' own units (CLI11 parsing, drivers) at -O0 too, as the tests'
  # (119 -> 52 CPU-s for the four under clang's sanitizers); the library they call keeps -O2.
  # -Dcold_optimization=0: the library's units that parse, write, register and compose (config/,
  # ckpt/, the text readers, models/, train/) at -O0; the units that compute (tensor/, nn/, optim/,
  # comm/, the engine, backends/) keep -O2. Under ASan+UBSan and the fuzzer's coverage, clang's back end (code generation for the
  # instrumented code) was most of each unit's time, -O1 and -O2 alike (the library 421 and 430
  # CPU-s); at -O0 it is a fast path. Measured on the 2-core EPYC VM: the whole library at -O0
  # compiled in 222 CPU-s instead of 467 (-O1) but the sanitize stage's tests took 395 CPU-s instead
  # of 219; the split with models/ and the trainer still at -O2: the build 543 CPU-s in all (the
  # library 283), the tests 235 CPU-s.
  # -mllvm -openmp-opt-disable: clang's OpenMPOpt pass runs on every unit built with -fopenmp and
  # was a quarter of the optimizer's time (clang 14 -ftime-trace of the ckpt unity file under the
  # sanitizers: 21 of 83 s; without it 74 -> 58 CPU-s); it only optimizes OpenMP runtime calls,
  # which this build does not time.
  options=(-Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized -Dcold_optimization=0 -Dtests_optimization=0
           -Dmpi_tests_optimization=0 -Dapps_optimization=0
           -Dfuzz=enabled "-Dcpp_args=-gline-tables-only -mllvm -openmp-opt-disable" -Dc_args=-gline-tables-only)
  # The CUDA code only where a GPU can run it: without one, its only test (test_gpu) skips, so
  # compiling the .cu kernels (nvcc, two architectures: about 65 s of the release build's
  # compile) and the CUDA runtime bought nothing here. The release build (tests/run.sh) still
  # compiles them.
  [ -e /dev/nvidiactl ] || options+=(-Dgpu=disabled)
  if [ ! -f "$build/build.ninja" ]; then
    # clang, so that the one sanitized build also holds the libFuzzer targets (-Dfuzz=enabled):
    # .ci/run's fuzz stage fuzzes them from this build instead of compiling the library a third
    # time (tests/fuzz/run.sh uses such a build as it is). Measured on 2 cores: gcc's sanitized
    # build 609 s wall / ~1,200 CPU-s plus the separate fuzz build; this one, fuzz targets
    # included, 372 s / 724 CPU-s. The release build (tests/run.sh) stays gcc: both compilers'
    # diagnostics, both code generators under test.
    # lld (CC_LD/CXX_LD): 58 executables link against the sanitized libfsdp.a; binutils ld took
    # 1.6 CPU-s for each (test_nn), lld 0.45.
    CC=clang CXX=clang++ CC_LD=lld CXX_LD=lld meson setup "$build" "${options[@]}" >"/tmp/sanitize-setup.$$.log" 2>&1 \
      || { cat "/tmp/sanitize-setup.$$.log"; fail "meson setup failed"; }
    mv "/tmp/sanitize-setup.$$.log" "$build/setup.log"
  elif ! grep -q "clang++" "$build/build.ninja"; then
    fail "$build was configured with another compiler (sanitize.sh uses clang now): remove it and rerun"
  else
    # `meson configure`, not `setup --reconfigure`: meson 1.0 keeps an existing build's cpp_args on
    # --reconfigure (seen: -Dcpp_args given there did not reach build.ninja).
    meson configure "$build" "${options[@]}" >/dev/null || fail "meson configure $build failed"
  fi
  if ! meson compile -C "$build" -j "$(getconf _NPROCESSORS_ONLN)" >"$build/compile.log" 2>&1; then
    tail -40 "$build/compile.log"
    fail "compile failed"
  fi
  echo "sanitize: $build configured and compiled in $(($(date +%s) - t0)) s"
fi
t1=$(date +%s)
# SANITIZE_BUILD_ONLY=1: stop here (.ci/run compiles this build in the background while the
# release build's tests leave cores idle, then runs the tests in its sanitize stage).
if [ "${SANITIZE_BUILD_ONLY:-0}" = 1 ]; then
  echo "1 passed, 0 failed"
  exit 0
fi

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1:intercept_tls_get_addr=0:check_initialization_order=1:strict_init_order=1
# The CUDA driver maps memory inside ASan's shadow gap (google/sanitizers#629): on a machine with
# an NVIDIA GPU the gap must stay unprotected or every CUDA call fails. (No GPU here: not exercised.)
if [ -e /dev/nvidiactl ]; then ASAN_OPTIONS+=:protect_shadow_gap=0; fi
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0
# Open MPI's plugins stay loaded to the end (tests/sanitizers/keep_loaded.c says why: LeakSanitizer
# took 1.5 s at each MPI process's exit, about half of test_app's time under the sanitizers).
keep_loaded=$build/libkeep_loaded.so
cc -shared -fPIC -O2 -o "$keep_loaded" "$root/tests/sanitizers/keep_loaded.c" || fail "cannot compile $keep_loaded"
export LD_PRELOAD=$(cd "$(dirname "$keep_loaded")" && pwd)/libkeep_loaded.so${LD_PRELOAD:+:$LD_PRELOAD}
# UCX's memory hooks (UCM) patch malloc/mmap in the loaded libraries (bistro mode rewrites the
# functions' code) to keep its registration cache coherent; a malloc UCM serves instead of ASan's
# is reported as a bad free, and UCX's own ASan builds switch UCM off. Only IB/GPU transports ask
# for these events (this machine's shm/tcp do not), so this only matters on such machines: the
# registration cache is then off, which costs speed, never correctness.
export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no
# As root on few cores (tests/run.sh): MPI tests oversubscribe; one BLAS thread per rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
. tests/mpi_env.sh  # the PML Open MPI picks anyway, without opening the others first
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# -t 3: every test's meson timeout x3. The instrumented binaries run 1.2-2x slower alone (more
# with the suppressions' slow unwinding under HDF5's many small mallocs); the Python tests' own
# per-run timeouts (120-300 s) are far above what one sanitized run takes.
[ $# -eq 0 ] && set -- --no-suite e2e --no-suite mpi_more --no-suite mpi_np1 --no-suite cli
no_rebuild=()
[ "${SANITIZE_TESTS_ONLY:-0}" = 1 ] && no_rebuild=(--no-rebuild)
meson test -C "$build" --print-errorlogs -t 3 "${no_rebuild[@]}" "$@"
rc=$?
t2=$(date +%s)
echo "sanitize: meson test took $((t2 - t1)) s; slowest tests:"
/usr/bin/python3 - "$build/meson-logs/testlog.json" <<'PY'
import json, sys
rows = sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda t: -t["duration"])
for t in rows[:8]:
    print(f"  {t['duration']:7.1f} s  {t['name']}  {t['result']}")
PY

/usr/bin/python3 tests/summary.py "$build/meson-logs/testlog.json"
summary_rc=$?
[ $rc -eq 0 ] && [ $summary_rc -eq 0 ]
