#!/usr/bin/env bash
# Installs, builds and runs the default job (input/fashion_mnist.yaml). Extra arguments go to
# fsdp_app, e.g. `bash jobs/run-default.sh --set train.epochs=1`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash jobs/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
meson compile -C build >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# FULL_SHARD on 4 ranks. Ranks may outnumber cores here (2 on CI machines): oversubscribe, no
# binding, and one BLAS/OpenMP thread per rank so they don't fight over cores.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
exec mpirun -np 4 --oversubscribe --bind-to none build/apps/fsdp_app input/fashion_mnist.yaml "$@"
