#!/usr/bin/env bash
# Installs, builds and runs the default job (input/fashion_mnist.yaml). Extra arguments go to
# fsdp_app, e.g. `bash jobs/run-default.sh --set train.epochs=1`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash jobs/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
meson compile -C build >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One rank until the FSDP engine lands; then: mpirun -np 4 --oversubscribe.
# --bind-to none: OpenMPI pins a lone rank to one core, which would idle the others' threads.
exec mpirun -np 1 --bind-to none build/apps/fsdp_app input/fashion_mnist.yaml "$@"
