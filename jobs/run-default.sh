#!/usr/bin/env bash
# Installs, builds and runs the default job (input/fashion_mnist.yaml). Extra arguments go to
# fsdp_app, e.g. `bash jobs/run-default.sh --set train.epochs=1`.
# Builds the apps only (the library and apps/): the Boost.Test suites are tests/run.sh's, which
# reuses and, once the test packages are installed, reconfigures this same build/.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! bash jobs/install-deps.sh; then
  echo "run-default: installing the packages failed (apt's lines above); next: fix what apt names (network, a held dpkg lock, disk space) and rerun bash jobs/run-default.sh"
  exit 1
fi
build=${FSDP_BUILD_DIR:-build}  # tests/front_door sets both variables (jobs/build.sh)
bash jobs/build.sh "$build" fsdp_app fsdp_ckpt fsdp_bench sgemm_peak || exit 1
[ "${FSDP_CONFIGURE_ONLY:-0}" = 1 ] && exit 0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# FULL_SHARD on 4 ranks. Ranks may outnumber cores here (2 on CI machines): oversubscribe, no
# binding, and one BLAS/OpenMP thread per rank so they don't fight over cores.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
exec mpirun -np 4 --oversubscribe --bind-to none "$build"/apps/fsdp_app input/fashion_mnist.yaml "$@"
