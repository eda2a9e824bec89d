#!/usr/bin/env bash
# Installs the Debian packages fsdp-hpc needs. Idempotent and quiet: packages already present
# are skipped; the dpkg lock is waited on, not fought.
#   bash jobs/install-deps.sh          what building and running need (the compiler, Meson,
#                                      OpenMPI, UCX, parallel HDF5, yaml-cpp, OpenBLAS, JSON,
#                                      CLI11, SentencePiece, the data, plotting)
#   bash jobs/install-deps.sh --tests  that, and what the tests and quality gates add (Boost.Test,
#                                      clang with its fuzzer and sanitizer runtimes, clang-tidy,
#                                      cppcheck, clang-format, PyTorch and h5py for the reference
#                                      checks, Slurm and munge, network namespaces)
#   bash jobs/install-deps.sh --tests-build
#                                      only what compiling the tests and the quality gates needs
#                                      (the first set, Boost.Test, clang, the lint tools): tests/run.sh
#                                      installs this first and the rest (what only running the
#                                      tests needs) while the build compiles
#   bash jobs/install-deps.sh --cuda-mpi
#                                      the first set, and what jobs/cuda-aware-mpi.sh needs to build
#                                      Open MPI from source (make, gcc, the PMIx/hwloc/libevent
#                                      headers Debian's build uses; a venv for pip)
# README.md gives the time of both README commands on a fresh machine (tests/fresh_machine.sh).
set -euo pipefail

run_packages=(
  # build
  g++ meson ninja-build pkg-config
  # libraries found by dependency() in meson.build
  openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools libucx-dev ucx-utils
  libyaml-cpp-dev zlib1g-dev
  # CLI11 (header-only): the apps' command lines and --help (apps/cli.h)
  libcli11-dev
  # JSON (seq2seq data rows; Hugging Face config.json and safetensors headers)
  nlohmann-json3-dev
  # SentencePiece (data.tokenizer: the spiece.model of HF T5 folders): the library, and
  # spm_train (jobs/make-summaries.sh trains one)
  libsentencepiece-dev sentencepiece
  # OpenBLAS built with OpenMP: one thread pool shared with our loops (see meson.build)
  libopenblas-openmp-dev
  # data: Fashion-MNIST (IDX, gzipped) and a text corpus (the fortune cookie files)
  dataset-fashion-mnist fortunes fortunes-min
  # jobs/gpu-bundle.sh packs, and tests/gpu_bundle unpacks, a .tar.xz
  xz-utils
  # jobs/plot-bench.sh draws fsdp_bench's CSV
  gnuplot-nox
)

# What compiling the tests, the sanitizer and fuzz build and the lint needs.
test_build_packages=(
  # the Boost.Test suites (meson builds them when Boost.Test is found)
  libboost-test-dev
  # tests/fuzz (libFuzzer targets, tests/fuzz/run.sh): clang 14 with its sanitizer and fuzzer
  # runtimes (libclang-rt-14-dev) and LLVM's OpenMP runtime, which clang's -fopenmp links; LLVM's
  # linker for that build (tests/sanitize.sh: a sanitized test executable links in 0.45 CPU-s
  # instead of binutils ld's 1.6)
  clang libclang-rt-14-dev libomp-14-dev lld
  # tests/lint.sh: clang-tidy 14 (.clang-tidy), cppcheck 2.10 (tests/lint/cppcheck.supp) and
  # clang-format 14 (.clang-format); clang-tidy parses with clang's own omp.h (libomp-14-dev)
  clang-tidy cppcheck clang-format
)

# What only running the tests needs (Python reference checks, Slurm, simulated hosts): on a fresh
# machine most of the install's time (PyTorch and its Python dependencies, byte-compiled by dpkg).
test_run_packages=(
  # reference checks against PyTorch (Debian's system python3, not pyenv's)
  python3-torch python3-h5py python3-numpy
  # ... and against Python's sentencepiece, which HF's T5Tokenizer uses too
  # (tests/reference/check_sentencepiece.py: our ids and our decoding)
  python3-sentencepiece
  # ... and against Hugging Face transformers (PyPI) in a venv over Debian's torch
  # (tests/reference/hf_venv.sh: `python3 -m venv` needs python3-venv)
  python3-venv
  # tests/multihost: simulated hosts (ip netns, veth, bridge; unshare and nsenter)
  iproute2 util-linux
  # tests/fault: pgrep finds processes a fault left behind (not in a minimal Debian; found by
  # tests/fresh_machine.sh)
  procps
  # Slurm for tests/slurm, which starts its own private munged, slurmctld and slurmd (nothing
  # here configures a system-wide one; on a cluster, jobs/*.sbatch use the cluster's Slurm).
  # srun --mpi=pmix needs Slurm's mpi_pmix plugin (slurm-wlm-basic-plugins) and the PMIx
  # library it opens (libpmix2).
  slurm-wlm slurm-wlm-basic-plugins munge libpmix2
)

# What jobs/cuda-aware-mpi.sh adds (Open MPI's configure and make; pip from a venv when the
# system's python3 has none). libopenmpi-dev already depends on the three -dev packages.
cuda_mpi_packages=(make gcc libpmix-dev libhwloc-dev libevent-dev python3-venv)

packages=("${run_packages[@]}")
case "${1:-}" in
  "") ;;
  --cuda-mpi) packages+=("${cuda_mpi_packages[@]}") ;;
  --tests) packages+=("${test_build_packages[@]}" "${test_run_packages[@]}") ;;
  --tests-build) packages+=("${test_build_packages[@]}") ;;
  *)
    echo "usage: bash jobs/install-deps.sh [--tests | --tests-build | --cuda-mpi]" >&2
    exit 2
    ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
