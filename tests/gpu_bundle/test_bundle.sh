#!/usr/bin/env bash
# The GPU bundle (jobs/gpu-bundle.sh) runs where none of the project's Debian packages is visible:
# unpacked, then in a private mount namespace (unshare -m) in which every file of the packages its
# libraries came from (OpenMPI, PMIx, UCX, hwloc, libevent, HDF5 and what it pulls in, yaml-cpp,
# OpenBLAS, libgomp, Boost.Test, zlib, ...) and their -dev packages is hidden (folders under an
# empty tmpfs, files under /dev/null), `run-gpu-checks.sh --cpu OUT` must pass (both models under
# mpirun -np 2 on mpi and ucx, a checkpoint saved, verified and resumed, mpirun -np 4, the missing GPU in one
# line) and ldd of every bundled binary must resolve only to the bundle, the CUDA toolkit's
# cuBLAS/NCCL (the GPU machine brings its own) or glibc/libstdc++/libgcc_s.
#
# usage: test_bundle.sh SOURCE_ROOT [ARCHIVE]   (default ARCHIVE: SOURCE_ROOT/gpu-bundle/fsdp-gpu.tar.xz)
# The bundle's nvcc build is minutes of compiling: when ARCHIVE does not exist the test skips
# (exit 77) unless GPU_BUNDLE_BUILD_IN_TEST=1, which builds it first. Root only.
set -uo pipefail
root=$(cd "$1" && pwd)
archive=${2:-$root/gpu-bundle/fsdp-gpu.tar.xz}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "gpu_bundle needs root (a mount namespace and bind mounts)"
command -v unshare >/dev/null && unshare -m true 2>/dev/null || skip "unshare -m is not available here"
if [ ! -f "$archive" ]; then
  [ "${GPU_BUNDLE_BUILD_IN_TEST:-0}" = 1 ] || skip "no bundle at $archive (build it: bash jobs/gpu-bundle.sh $archive; or set GPU_BUNDLE_BUILD_IN_TEST=1)"
  mkdir -p "$(dirname "$archive")"
  bash "$root/jobs/gpu-bundle.sh" "$archive" || { echo "FAIL: jobs/gpu-bundle.sh"; exit 1; }
fi
size=$(stat -c %s "$archive")
echo "bundle $archive: $size bytes"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ "$size" -le $((48 * 1024 * 1024)) ] || fail "archive is over 48 MiB"

work=$(mktemp -d /tmp/gpu_bundle_test.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -xf "$archive" -C "$work" || { echo "FAIL: cannot unpack"; exit 1; }
B=$work/fsdp-gpu
[ -x "$B/run-gpu-checks.sh" ] || fail "no run-gpu-checks.sh at the top of fsdp-gpu/"

# The packages to hide: those that own the originals of the bundled libraries, the project's own
# (and their -dev packages), minus glibc/libstdc++/libgcc and what the shell tools need.
keep=" libc6 libstdc++6 libgcc-s1 "
for t in bash grep sed mawk sort timeout ls tar xz hostname; do
  for p in $(ldd "$(command -v $t)" | awk '/=>/ {print $3}'); do
    keep+=" $(dpkg -S "$p" 2>/dev/null | cut -d: -f1 | head -1) "
    keep+=" $(dpkg -S "$(readlink -f "$p")" 2>/dev/null | cut -d: -f1 | head -1) "
  done
done
paths=()
for f in "$B"/lib/*.so* "$B"/lib/ucx/*; do
  s=$(basename "$f")
  paths+=("/usr/lib/x86_64-linux-gnu/$s" "/lib/x86_64-linux-gnu/$s" "/usr/lib/x86_64-linux-gnu/ucx/$s")
done
pkgs=$( (dpkg -S "${paths[@]}" 2>/dev/null | cut -d: -f1 | tr ', ' '\n\n'
  echo openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libpmix-dev libucx0 libucx-dev \
    libopenblas0-openmp libopenblas0-pthread libopenblas-openmp-dev libopenblas-dev libopenblas0 \
    libhdf5-openmpi-dev libhdf5-openmpi-103-1 libyaml-cpp-dev libyaml-cpp0.7 libboost-test-dev \
    libboost-test1.74.0 libboost-test1.74-dev libhwloc15 libhwloc-plugins libevent-2.1-7 | tr ' ' '\n') |
  grep . | sort -u | while read -r p; do dpkg -s "$p" >/dev/null 2>&1 && [[ $keep != *" $p "* ]] && echo "$p"; done)
echo "hiding $(echo $pkgs | wc -w) packages: $(echo $pkgs | tr '\n' ' ')"
[[ $keep == *" zlib1g "* ]] && echo "(kept visible for the shell tools: $(echo $keep | tr ' ' '\n' | sort -u | grep -v '^$' | tr '\n' ' '))"

# One mount script, run inside the namespace: folders a package owns alone get a tmpfs, files
# get /dev/null bound over them.
hide=$work/hide.sh
{
  echo "set -e"
  dirs=$(for p in $pkgs; do dpkg -L "$p"; done | sort -u | while read -r d; do
    [ -d "$d" ] && [ ! -L "$d" ] || continue
    case $d in /usr/lib/x86_64-linux-gnu/openmpi|/usr/lib/x86_64-linux-gnu/pmix2|/usr/lib/x86_64-linux-gnu/ucx|\
      /usr/lib/x86_64-linux-gnu/openblas-*|/usr/lib/x86_64-linux-gnu/hwloc|/usr/lib/x86_64-linux-gnu/hdf5|\
      /usr/share/openmpi|/etc/openmpi|/usr/include/hdf5|/usr/lib/x86_64-linux-gnu/cmake/*) echo "$d" ;; esac
  done)
  top=""
  for d in $dirs; do  # the outermost folders only (sorted: a parent comes before its children)
    [ -n "$top" ] && [[ $d == "$top"/* ]] && continue
    top=$d
    echo "mount -t tmpfs none '$d'"
  done
  for p in $pkgs; do dpkg -L "$p"; done | sort -u | while read -r f; do
    case $f in /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*|/usr/include/*) continue ;; esac
    in_dir=0
    for d in $dirs; do [[ $f == "$d" || $f == "$d"/* ]] && in_dir=1 && break; done
    [ $in_dir -eq 1 ] && continue
    if [ -L "$f" ] || [ -f "$f" ]; then
      [ -e "$f" ] && echo "mount --bind /dev/null '$(readlink -f "$f")' 2>/dev/null || true"
    fi
  done
} >"$hide"
# A bundle built on jobs/cuda-aware-mpi.sh's Open MPI and UCX (BUILD-INFO names the prefix's folder):
# the prefix is hidden too, or the binaries' build-time run path would find its libraries here.
cuda_mpi=$(awk '$1 == "openmpi" && /CUDA-aware/ {gsub(/[()]/, "", $NF); print $NF}' "$B/BUILD-INFO")
for d in "${HOME:-/root}/.cache/fsdp-hpc/$cuda_mpi" ${FSDP_CUDA_MPI:-}; do
  [ -n "$cuda_mpi" ] && [ -d "$d" ] && echo "mount -t tmpfs none '$d'" >>"$hide"
done
echo "$(grep -c mount "$hide") mounts"

# Inside the namespace: hide, check that the hiding works, run the checks, ldd the binaries.
cat >"$work/inside.sh" <<EOF
set -u
. '$hide' || { echo "FAIL: hiding the packages"; exit 1; }
if [ -s /usr/lib/x86_64-linux-gnu/libhdf5_openmpi.so.103 ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so ] || [ -s /usr/lib/x86_64-linux-gnu/libopenblas.so.0 ]; then
  echo "FAIL: the Debian packages are still visible"; exit 1
fi
echo "Debian's OpenMPI/HDF5 are hidden: /usr/bin/orterun is \$(stat -c %s /usr/bin/orterun) bytes"
# Without the bundle's folder the binaries must not load (else the hiding missed something).
# (A hidden file reads as empty: "file too short"; a hidden folder's: "not found".)
if ! env -u LD_LIBRARY_PATH ldd '$B/bin/fsdp_app' 2>&1 | grep -qE 'libmpi.so.40 => not found|libmpi.so.40: file too short'; then
  echo "FAIL: fsdp_app finds libmpi outside the bundle: \$(env -u LD_LIBRARY_PATH ldd '$B/bin/fsdp_app' | grep libmpi)"
fi
'$B/run-gpu-checks.sh' --cpu '$work/out'
echo "run-gpu-checks.sh --cpu exit \$?"
cuda=\$(dirname "\$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ -maxdepth 1 -name 'libcublas.so.*' 2>/dev/null | head -1)")
for b in '$B'/bin/* '$B'/ompi/bin/orterun '$B'/ompi/bin/orted; do
  [ -L "\$b" ] && continue
  LD_LIBRARY_PATH='$B/lib':\$cuda ldd "\$b" | awk -v b="\$b" -v B='$B' -v C="\$cuda" '
    /not found/ { print "LDD-BAD " b ": " \$0; next }
    /=>/ { p = \$3; if (index(p, B "/") == 1 || (C != "" && index(p, C "/") == 1)) next
           if (\$1 ~ /^(libc|libm|libdl|libpthread|librt|libutil|libresolv|libmvec|libstdc\+\+|libgcc_s)\.so/) next
           print "LDD-BAD " b ": " \$1 " => " p }'
done
EOF
unshare -m --propagation private bash "$work/inside.sh" >"$work/inside.log" 2>&1
cat "$work/inside.log"
grep -q "^run-gpu-checks.sh --cpu exit 0" "$work/inside.log" || fail "run-gpu-checks.sh --cpu did not pass in the namespace"
grep -q '^FAIL' "$work/inside.log" && fail "see above"
grep -q '^LDD-BAD' "$work/inside.log" && fail "ldd resolved libraries outside the bundle/CUDA/glibc (LDD-BAD lines)"
if [ -f "$work/out/report.json" ]; then
  for c in cpu_train cpu_checkpoint cpu_mpirun_np4; do
    grep -q "\"name\": \"$c\", \"result\": \"pass\"" "$work/out/report.json" || fail "$c did not pass"
  done
  grep -q '"name": "gpu", "result": "skip", [^}]*"note": "no GPU' "$work/out/report.json" || fail "no one-line 'no GPU' report"
else
  fail "no report.json"
fi
if [ $fails -eq 0 ]; then echo "gpu_bundle: 1 test case out of 1 passed"; exit 0; fi
echo "gpu_bundle: 1 test case out of 1 failed ($fails problems)"
exit 1
