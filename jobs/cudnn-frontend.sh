#!/bin/bash
# Prints the include folder of NVIDIA's cuDNN frontend (header-only C++, MIT licence), which the
# GPU build's fused attention (model.attention: fused, src/tensor/cuda/cudnn_attention.cpp) is
# written against. meson takes it as -Dcudnn_frontend_include=DIR; jobs/gpu-bundle.sh calls this.
#
# The headers come from PyPI's wheel nvidia-cudnn-frontend (pinned below: the API the code was
# written for), unpacked into ${FSDP_CUDNN_FRONTEND:-$HOME/.cache/fsdp-hpc/cudnn-frontend-VERSION}.
# Only the include/ folder is kept (3.2 MB; the wheel is 11.6 MB). cuDNN itself is not needed to
# build: the frontend loads libcudnn.so.9 when fused attention first runs
# (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), so a binary built with it starts without cuDNN and says
# so in one line when a run asks for fused attention.
#
# Idempotent: a complete folder (stamp READY holding the version) is only printed. On failure: one
# line on stderr, exit 1.
#
# usage: inc=$(bash jobs/cudnn-frontend.sh) && meson configure build -Dcudnn_frontend_include="$inc"
set -u -o pipefail

VERSION=1.32.0
DIR=${FSDP_CUDNN_FRONTEND:-$HOME/.cache/fsdp-hpc/cudnn-frontend-$VERSION}

if [ "$(cat "$DIR/READY" 2>/dev/null)" = "$VERSION" ] && [ -f "$DIR/include/cudnn_frontend.h" ]; then
  echo "$DIR/include"
  exit 0
fi
mkdir -p "$(dirname "$DIR")" || { echo "cudnn-frontend: cannot create $(dirname "$DIR")" >&2; exit 1; }
tmp=$(mktemp -d "$(dirname "$DIR")/.cudnn-frontend.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# Any python3 with pip will do: it only downloads (the wheel's Python parts are not used).
py=$(command -v python3 || echo /usr/bin/python3)
if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: "nvidia-cudnn-frontend==$VERSION" \
  -d "$tmp/wheel" >"$tmp/pip.log" 2>&1; then
  echo "cudnn-frontend: pip could not download nvidia-cudnn-frontend==$VERSION from PyPI: $(tail -1 "$tmp/pip.log")" >&2
  exit 1
fi
whl=$(ls "$tmp"/wheel/*.whl 2>/dev/null | head -1)
if ! "$py" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])' "$whl" "$tmp/out" 2>"$tmp/unzip.log" ||
  [ ! -f "$tmp/out/include/cudnn_frontend.h" ]; then
  echo "cudnn-frontend: $whl has no include/cudnn_frontend.h ($(tail -1 "$tmp/unzip.log"))" >&2
  exit 1
fi
echo "$VERSION" >"$tmp/out/READY"
rm -rf "$DIR" && mv "$tmp/out" "$DIR" || { echo "cudnn-frontend: cannot move the headers to $DIR" >&2; exit 1; }
echo "$DIR/include"
