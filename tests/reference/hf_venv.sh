#!/bin/bash
# Prints the path of a Python interpreter that has Hugging Face transformers 4.36.2 on top of
# Debian's system torch 1.13 (python3-torch), for tests/reference/t5_reference.py and check_t5.py.
#
# The interpreter lives in a venv made by `/usr/bin/python3 -m venv --system-site-packages`
# in ${FSDP_HF_VENV:-$HOME/.cache/fsdp-hpc/hf-venv}: torch, numpy, h5py, requests and PyYAML
# come from Debian; pip installs transformers and the packages below (all pinned, wheels only).
# None of them depends on torch, so pip never fetches a torch of its own; the checks after the
# install make sure torch and numpy are still Debian's (a numpy from PyPI would not match the
# numpy that Debian's torch was built against).
#
# Idempotent: once a venv is complete (the stamp file READY holds the pins below), a call only
# reads the stamp and prints the path (a few milliseconds). A venv without a matching stamp (an
# interrupted install, other pins) is removed and made again. Concurrent calls wait on a lock.
# On failure: one line on stderr saying what failed (pip's output is in $VENV.log), exit 1.
#
# usage: PY=$(bash tests/reference/hf_venv.sh) && "$PY" tests/reference/t5_reference.py ...
set -u -o pipefail

VENV=${FSDP_HF_VENV:-$HOME/.cache/fsdp-hpc/hf-venv}
SYSTEM_PYTHON=/usr/bin/python3
# transformers 4.36.2 (December 2023) and the versions of its dependencies from the same weeks.
PINS="transformers==4.36.2 tokenizers==0.15.2 huggingface-hub==0.20.3 safetensors==0.4.2 \
packaging==23.2 filelock==3.13.1 tqdm==4.66.1 regex==2023.12.25 fsspec==2023.12.2"
STAMP="$VENV/READY"

ready() { [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ]; }
fail() { echo "hf_venv.sh: $*" >&2; exit 1; }

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
"$SYSTEM_PYTHON" -c 'import torch, numpy' >>"$LOG" 2>&1 ||
  fail "Debian's torch is missing: $SYSTEM_PYTHON cannot import torch and numpy (apt-get install python3-torch)"
rm -rf "$VENV" || fail "cannot remove the incomplete venv $VENV"
"$SYSTEM_PYTHON" -m venv --system-site-packages "$VENV" >>"$LOG" 2>&1 ||
  fail "$SYSTEM_PYTHON -m venv --system-site-packages $VENV failed (python3-venv installed?); log $LOG"
# shellcheck disable=SC2086  # PINS is a list of words
PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --no-input --only-binary=:all: $PINS >>"$LOG" 2>&1 ||
  fail "pip install $(echo "$PINS" | cut -d' ' -f1) into $VENV failed:" \
    "$(grep -E '^ERROR' "$LOG" | head -n1 | cut -c1-200) (log $LOG)"
# torch and numpy must be Debian's, under /usr/lib/python3/dist-packages, not copies in the venv.
if ! "$VENV/bin/python" - >>"$LOG" 2>&1 <<'EOF'
import numpy, torch, transformers
for m in (torch, numpy):
    if not m.__file__.startswith("/usr/lib/python3/dist-packages/"):
        raise SystemExit(f"{m.__name__} {m.__version__} imported from {m.__file__}, not Debian's")
if not torch.__version__.startswith("1.13"):
    raise SystemExit(f"torch is {torch.__version__}, not Debian's 1.13")
if transformers.__version__ != "4.36.2":
    raise SystemExit(f"transformers is {transformers.__version__}, not 4.36.2")
from transformers import T5Config, T5ForConditionalGeneration  # noqa: F401  (imports torch parts)
print(f"ok: torch {torch.__version__} ({torch.__file__}), numpy {numpy.__version__}, "
      f"transformers {transformers.__version__}")
EOF
then
  fail "the venv's torch, numpy or transformers is not the expected one: $(tail -n1 "$LOG") (log $LOG)"
fi
echo "$PINS" >"$STAMP" || fail "cannot write $STAMP"
echo "$VENV/bin/python"
