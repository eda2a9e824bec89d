#!/bin/bash
# Prints the path of a Python interpreter with PyTorch 2.x from PyPI, for jobs/bench-peer.sh.
#
# The interpreter lives in a venv made by `/usr/bin/python3 -m venv` (no --system-site-packages,
# so Debian's python3-torch 1.13 and its numpy cannot shadow the pins) in
# ${FSDP_TORCH2_VENV:-$HOME/.cache/fsdp-hpc/torch2-venv}. pip installs the pins below from
# PyPI, wheels only. PyPI's Linux x86-64 torch wheel is the CUDA build: pip also fetches the
# nvidia-* CUDA runtime wheels it depends on; the benchmark uses only the CPU, but PyPI has no
# CPU-only torch for Linux (download.pytorch.org has; it is not reachable here) and torch
# installed without them does not import (libtorch_cuda.so needs libcufile.so.0 and the rest).
# Measured (November 2026, 2-core EPYC, busy): the first install downloads ~3 GB and takes ~7
# minutes; the venv is 5.4 GB (nvidia 3.0 GB, torch 1.2 GB, triton 1.0 GB).
#
# Idempotent: once a venv is complete (the stamp file READY holds the pins below), a call only
# reads the stamp and prints the path. A venv without a matching stamp (an interrupted install,
# other pins) is removed and made again. Concurrent calls wait on a lock.
# On failure: one line on stderr saying what failed (pip's output is in $VENV.log), exit 1.
#
# usage: PY=$(bash jobs/torch2_venv.sh) && "$PY" tests/reference/torch_peer.py ...
set -u -o pipefail

VENV=${FSDP_TORCH2_VENV:-$HOME/.cache/fsdp-hpc/torch2-venv}
SYSTEM_PYTHON=/usr/bin/python3
TORCH_VERSION=2.15.0
# torch 2.15.0 (PyPI's CUDA 13 build), numpy, h5py and every package they pull in, pinned to what
# pip resolved for them (November 2026), so that every venv is the same.
PINS="torch==$TORCH_VERSION numpy==2.4.6 h5py==3.16.0 \
filelock==4.3.1 fsspec==2026.9.0 Jinja2==3.1.6 MarkupSafe==3.0.4 mpmath==1.3.0 networkx==3.6.1 \
sympy==1.14.0 typing_extensions==4.16.0 triton==3.9.0 cuda-bindings==13.5.0 cuda-pathfinder==1.9.1 \
cuda-toolkit==13.2.2 nvidia-cublas==13.4.1.3 nvidia-cuda-cccl==13.3.5.0.6 nvidia-cuda-cupti==13.2.86 \
nvidia-cuda-nvrtc==13.2.86 nvidia-cuda-runtime==13.2.86 nvidia-cudnn-cu13==9.26.0.51 \
nvidia-cufft==12.2.0.57 nvidia-cufile==1.17.1.22 nvidia-cusolver==12.2.0.11 \
nvidia-cusparse==12.7.10.12 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 \
nvidia-nvjitlink==13.5.37 nvidia-nvshmem-cu13==3.7.2 nvidia-nvtx==13.2.86"
STAMP="$VENV/READY"

ready() { [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ]; }
fail() { echo "torch2_venv.sh: $*" >&2; exit 1; }

if ready; then
  echo "$VENV/bin/python"
  exit 0
fi

mkdir -p "$(dirname "$VENV")" || fail "cannot create $(dirname "$VENV")"
exec 9>"$VENV.lock" || fail "cannot open the lock file $VENV.lock"
flock 9 || fail "cannot lock $VENV.lock"
if ready; then  # another call finished it while this one waited
  echo "$VENV/bin/python"
  exit 0
fi

LOG="$VENV.log"
: >"$LOG" || fail "cannot write $LOG"
[ -x "$SYSTEM_PYTHON" ] || fail "no $SYSTEM_PYTHON (Debian's python3)"
rm -rf "$VENV" || fail "cannot remove the incomplete venv $VENV"
"$SYSTEM_PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 ||
  fail "$SYSTEM_PYTHON -m venv $VENV failed (python3-venv installed?); log $LOG"
echo "torch2_venv.sh: installing $PINS into $VENV (first run only; several GB from PyPI)" >&2
# shellcheck disable=SC2086  # PINS is a list of words
PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --no-input --only-binary=:all: $PINS >>"$LOG" 2>&1 ||
  fail "pip install $PINS into $VENV failed:" \
    "$(grep -E '^ERROR' "$LOG" | head -n1 | cut -c1-200) (log $LOG)"
# torch must be the venv's own 2.x with the composable FSDP2 API, not Debian's 1.13.
if ! TORCH_VERSION=$TORCH_VERSION "$VENV/bin/python" - >>"$LOG" 2>&1 <<'EOF_PY'
import os, h5py, numpy, torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard  # noqa: F401  (FSDP2; public here since 2.6)
if torch.__version__.split("+")[0] != os.environ["TORCH_VERSION"]:
    raise SystemExit(f"torch is {torch.__version__} from {torch.__file__}, not {os.environ['TORCH_VERSION']}")
if "/usr/lib/python3/dist-packages/" in torch.__file__ or "/usr/lib/python3/dist-packages/" in numpy.__file__:
    raise SystemExit(f"Debian's torch or numpy shadows the venv's: {torch.__file__}, {numpy.__file__}")
if not dist.is_gloo_available():
    raise SystemExit("this torch has no gloo backend")
print(f"ok: torch {torch.__version__} ({torch.__file__}), numpy {numpy.__version__}, h5py {h5py.__version__}")
EOF_PY
then
  fail "the venv's torch, numpy or h5py is not the expected one: $(tail -n1 "$LOG") (log $LOG)"
fi
echo "$PINS" >"$STAMP" || fail "cannot write $STAMP"
echo "$VENV/bin/python"
