#!/usr/bin/env bash
# tests/mpirun.sh NP EXE [ARGS...]: runs an MPI test executable on NP ranks of this machine, so
# that a hang becomes a failure (exit 124 after 300 s) instead of stalling the test run.
#   --oversubscribe  more ranks than cores (CI machines have 2)
#   --bind-to none   oversubscribed ranks must not be pinned to the same core
#   root allowance   containers and CI run as root
#   OMPI_MCA_btl_vader_single_copy_mechanism=none: the shared-memory BTL's CMA single copy
#                    needs ptrace rights that containers without CAP_SYS_PTRACE withhold
#                    (then every large message fails). Not needed on this VM (CMA works:
#                    comm_np4 passes with =cma too); the environment can override it.
#   OMPI_MCA_rmaps_base_oversubscribe=1: also for ranks a test spawns itself
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: tests/mpirun.sh NP EXE [ARGS...]" >&2
  exit 2
fi
np=$1
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec timeout --kill-after=10 300 mpirun --oversubscribe -np "$np" --bind-to none "$@"
