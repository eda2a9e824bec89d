#!/usr/bin/env bash
# Builds the GPU release (-Dgpu=enabled, static cudart) and packs everything the bare GPU
# machine lacks into one archive that unpacks to fsdp-gpu/ (issue 14, part 1):
#
#   bash jobs/gpu-bundle.sh FILE.tar.xz
#
#   fsdp-gpu/run-gpu-checks.sh   the checks (jobs/run-gpu-checks.sh); env.sh sets the environment
#   fsdp-gpu/bin/                fsdp_app fsdp_bench fsdp_ckpt sgemm_peak test_gpu test_comm
#                                test_device_comm, mpirun (-> ../ompi/bin/orterun)
#   fsdp-gpu/lib/                every shared library they and the plugins load except glibc,
#                                libstdc++, libgcc_s, the driver (libcuda), cuBLAS/cuBLASLt and
#                                NCCL (the GPU machine's own: run-gpu-checks.sh finds them);
#                                lib/ucx/ UCX's transport modules (found beside libucs)
#   fsdp-gpu/ompi/               OpenMPI 4.1 relocated (OPAL_PREFIX): bin/orterun, bin/orted, its
#                                MCA plugins at its relative path, share/openmpi help files. The
#                                CUDA-aware Open MPI and UCX of jobs/cuda-aware-mpi.sh when that
#                                has been built (GPU_BUNDLE_MPI=cuda-aware builds it first,
#                                =debian takes Debian's), else Debian's; BUILD-INFO says which
#   fsdp-gpu/pmix/               PMIx's plugins and help files (PMIX_INSTALL_PREFIX)
#   fsdp-gpu/etc/                Debian's openmpi-mca-params.conf
#   fsdp-gpu/py/                 the performance check's PyTorch FSDP2 side (gpu_perf_fsdp2.py,
#                                torch_models.py), run with the GPU machine's own PyTorch, and
#                                ncu_kernel_table.py (its kernel breakdown)
#   fsdp-gpu/input/              the repository's input/*.yaml
#   fsdp-gpu/data/               a Fashion-MNIST slice (4000 train, 1000 test images, the IDX
#                                format fsdp_app reads) and ~300 KB of Debian's fortunes
#   fsdp-gpu/BUILD-INFO          commit, CUDA/cuBLAS/NCCL versions built with, gpu_arch
#
# Environment: GPU_BUNDLE_BUILD (build folder, default build-gpu-bundle), GPU_BUNDLE_ARCH
# (default 80,90: A100 and H100/H200), NVCC (default: nvcc on PATH, else /usr/local/cuda/bin).
# The archive must stay under 48 MiB (the device tool carries 64 MiB per call): checked at the end.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: jobs/gpu-bundle.sh FILE.tar.xz" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
archive=$(realpath -m "$1")
# The archive's folder (the device tool's carry folder, gpu-bundle/, is git-ignored and absent in a
# fresh clone): made now, so a bad path fails before minutes of nvcc, not after.
mkdir -p "$(dirname "$archive")" 2>/dev/null || { echo "gpu-bundle: cannot create $(dirname "$archive") for $1" >&2; exit 2; }
# The data planes (issue 40): the CUDA-aware build when there is one (or asked for), else Debian's.
cuda_mpi=
case ${GPU_BUNDLE_MPI:-auto} in
  auto) cuda_mpi=$(bash "$root/jobs/cuda-aware-mpi.sh" --cached 2>/dev/null | tail -1) || cuda_mpi= ;;
  cuda-aware) cuda_mpi=$(bash "$root/jobs/cuda-aware-mpi.sh" | tail -1) || exit 1 ;;
  debian) ;;
  *) echo "gpu-bundle: GPU_BUNDLE_MPI=$GPU_BUNDLE_MPI: expected auto, cuda-aware or debian" >&2; exit 2 ;;
esac
# A build folder per MPI: the MPI, HDF5 and UCX dependencies are found once, at setup.
build=${GPU_BUNDLE_BUILD:-$root/build-gpu-bundle${cuda_mpi:+-cuda-mpi}}
arch=${GPU_BUNDLE_ARCH:-80,90}
limit=$((48 * 1024 * 1024))
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
multiarch=/usr/lib/x86_64-linux-gnu

apps=(apps/fsdp_app apps/fsdp_bench apps/fsdp_ckpt apps/sgemm_peak apps/gpu_versions)
tests=(tests/test_gpu tests/test_comm tests/test_device_comm)
t0=$(date +%s)
# The host code for x86-64-v3 (AVX2 + FMA: every H100/H200 host), not -march=native (this
# machine's CPU may have more) nor the baseline (no FMA: the CPU optimizer kernels would then round
# differently from the CUDA ones, which use fmaf, see kernel_math.h; test_gpu checks them bitwise).
# Fused attention (model.attention: fused) needs the cuDNN frontend's headers (PyPI, cached).
fe_inc=$(bash "$root/jobs/cudnn-frontend.sh") || exit 1
opts=(-Dbuildtype=release -Dgpu=enabled -Dgpu_arch="$arch" -Dnative_arch=false -Dcpp_args=-march=x86-64-v3
  -Dstatic_cudart=true -Dtests=enabled -Dfuzz=disabled -Dcudnn_frontend_include="$fe_inc")
[ -n "$cuda_mpi" ] && opts+=(-Dpkg_config_path="$cuda_mpi/lib/pkgconfig")
echo "gpu-bundle: Open MPI and UCX: ${cuda_mpi:-Debian (no CUDA)}"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" "${opts[@]}" >"$build.setup.log" 2>&1 || { tail -30 "$build.setup.log"; exit 1; }
else
  meson configure "$build" "${opts[@]}" >"$build.setup.log" 2>&1 || { tail -30 "$build.setup.log"; exit 1; }
fi
# Only what goes in the bundle; GPU_BUNDLE_JOBS parallel jobs (default 2: shared machines).
nice ninja -C "$build" -j "${GPU_BUNDLE_JOBS:-2}" "${apps[@]}" "${tests[@]}"
t1=$(date +%s)
echo "gpu-bundle: build $((t1 - t0)) s"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
B=$stage/fsdp-gpu
mkdir -p "$B"/{bin,lib/ucx,etc,data/fashion-mnist,data/fortunes}
for t in "${apps[@]}" "${tests[@]}"; do cp "$build/$t" "$B/bin/"; done
strip --strip-unneeded "$B"/bin/*

# OpenMPI at its install layout under ompi/ (its prefix -> OPAL_PREFIX): the launcher, its MCA
# plugins (Pkglibdir), the help files (Pkgdatadir). PMIx (prefix .../pmix2, Debian's in both
# cases) likewise under pmix/. UCX's modules in lib/ucx (UCX_MODULE_DIR).
mkdir -p "$B/ompi/bin" "$B/ompi/share" "$B/pmix/lib" "$B/pmix/share"
if [ -n "$cuda_mpi" ]; then
  ompi_plugins=ompi/lib/openmpi
  mkdir -p "$B/ompi/lib"
  cp "$cuda_mpi/bin/orterun" "$cuda_mpi/bin/orted" "$B/ompi/bin/"
  cp -r "$cuda_mpi/lib/openmpi" "$B/ompi/lib/"
  rm -f "$B/$ompi_plugins"/*.la
  cp -r "$cuda_mpi/share/openmpi" "$B/ompi/share/"
  # Debian's settings less its `pml = ^ucx` and `osc = ^ucx`: this Open MPI's pml ucx is the one
  # that moves device memory over UCX's cuda transports.
  # Quiet where libcuda is missing (run-gpu-checks.sh --cpu; gpu_versions reports the driver):
  # Open MPI's 12-line notice otherwise reaches mpirun as a help message it fails to unpack.
  { grep -vE '^(pml|osc) *=' /etc/openmpi/openmpi-mca-params.conf; echo "opal_warn_on_missing_libcuda = 0"; } \
    >"$B/etc/openmpi-mca-params.conf"
  ucx_modules=("$cuda_mpi"/lib/ucx/libuct_*.so.0 "$cuda_mpi"/lib/ucx/libucm_*.so.0)
else
  ompi_plugins=ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
  mkdir -p "$B/$(dirname "$ompi_plugins")"
  cp /usr/bin/orterun /usr/bin/orted "$B/ompi/bin/"
  cp -r $multiarch/openmpi/lib/openmpi3 "$B/$(dirname "$ompi_plugins")/"
  cp -r /usr/share/openmpi "$B/ompi/share/"
  cp /etc/openmpi/openmpi-mca-params.conf "$B/etc/"
  ucx_modules=($multiarch/ucx/libuct_*.so.0 $multiarch/ucx/libucm_*.so.0 $multiarch/ucx/libucx_*.so.0)
fi
ln -s orterun "$B/ompi/bin/mpirun"
ln -s ../ompi/bin/orterun "$B/bin/mpirun"
rm -f "$B"/ompi/share/openmpi/*wrapper-data.txt
cp -r $multiarch/pmix2/lib/pmix "$B/pmix/lib/"
cp -r $multiarch/pmix2/share/pmix "$B/pmix/share/"
for m in "${ucx_modules[@]}"; do
  [ -e "$m" ] && cp -L "$m" "$B/lib/ucx/"
done

# Every library the binaries and plugins load, by soname, except the base system's and the
# GPU machine's own. OpenBLAS: the OpenMP build (Debian's alternative may point at pthreads).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libdl\.so|libpthread|librt\.so|libutil\.so|libresolv|libanl|libnsl|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia-ml|libcublas|libcublasLt|libnccl)'
declare -A have=()
collect() {  # ELF files
  local f soname path
  for f in "$@"; do
    while read -r soname path; do
      [[ $soname =~ $skip ]] && continue
      [ -n "${have[$soname]:-}" ] && continue
      if [ "$path" = "not" ] || [ -z "$path" ]; then
        case $soname in libcublas*|libnccl*|libcuda*|libnvidia-ml*) continue ;; esac
        echo "gpu-bundle: $f needs $soname, which is not found here" >&2; exit 1
      fi
      [ "$soname" = libopenblas.so.0 ] && path=$multiarch/openblas-openmp/libopenblas.so.0
      have[$soname]=$path
      cp -L "$path" "$B/lib/$soname"
    done < <(ldd "$f" | awk '/=>/ {print $1, $3}')
  done
}
collect "$B"/bin/* "$B"/ompi/bin/orterun "$B"/ompi/bin/orted "$B/$ompi_plugins"/*.so \
  "$B"/pmix/lib/pmix/*.so "$B"/lib/ucx/*.so.0
# libmpi's and friends' components dlopen by sonames ldd already saw; strip the debug sections.
strip --strip-unneeded "$B"/lib/*.so* "$B"/lib/ucx/* 2>/dev/null || true

cp -r "$root/input" "$B/"
cp "$root/jobs/run-gpu-checks.sh" "$B/run-gpu-checks.sh"
chmod +x "$B/run-gpu-checks.sh"
# The performance check's PyTorch FSDP2 side: the torch twin of our transformer.
mkdir -p "$B/py"
cp "$root/jobs/gpu_perf_fsdp2.py" "$root/jobs/ncu_kernel_table.py" "$root/tests/reference/torch_models.py" "$B/py/"

# Data: the first 4000 training and 1000 test images of Debian's Fashion-MNIST, in the same
# gzipped IDX files; ~300 KB of fortunes (whole files, in name order).
/usr/bin/python3 - "$B/data/fashion-mnist" <<'EOF'
import gzip, struct, sys
src, dst = "/usr/share/datasets/fashion-mnist", sys.argv[1]
for split, n in (("train", 4000), ("t10k", 1000)):
    img = gzip.open(f"{src}/{split}-images-idx3-ubyte.gz").read()
    lab = gzip.open(f"{src}/{split}-labels-idx1-ubyte.gz").read()
    _, _, rows, cols = struct.unpack(">IIII", img[:16])
    with gzip.open(f"{dst}/{split}-images-idx3-ubyte.gz", "wb", 9) as f:
        f.write(struct.pack(">IIII", 0x803, n, rows, cols) + img[16:16 + n * rows * cols])
    with gzip.open(f"{dst}/{split}-labels-idx1-ubyte.gz", "wb", 9) as f:
        f.write(struct.pack(">II", 0x801, n) + lab[8:8 + n])
EOF
total=0
for f in $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort); do
  [ $total -ge 300000 ] && break
  cp "$f" "$B/data/fortunes/"
  total=$((total + $(stat -c %s "$f")))
done

def() { grep -m1 "#define $1 " "$2" | awk '{print $3}'; }
inc=$cuda_root/include
{
  echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release; echo "$PRETTY_NAME")"
  echo "gpu_arch $arch"
  echo "nvcc $(nvcc --version | awk -F'release ' '/release/ {print $2}')"
  v=$(def CUDART_VERSION "$inc/cuda_runtime_api.h"); echo "cudart $((v / 1000)).$((v % 1000 / 10)) (static)"
  echo "cublas $(def CUBLAS_VER_MAJOR "$inc/cublas_api.h").$(def CUBLAS_VER_MINOR "$inc/cublas_api.h").$(def CUBLAS_VER_PATCH "$inc/cublas_api.h")"
  echo "nccl $(def NCCL_MAJOR "$inc/nccl.h").$(def NCCL_MINOR "$inc/nccl.h").$(def NCCL_PATCH "$inc/nccl.h")"
  echo "nccl_min 2.18.0"
  if [ -n "$cuda_mpi" ]; then
    echo "openmpi $("$cuda_mpi/bin/ompi_info" --parsable | awk -F: '/^ompi:version:full:/ {print $4}') CUDA-aware ($(basename "$cuda_mpi"))"
    echo "ucx $(cat "$cuda_mpi/lib/pkgconfig/ucx.pc" | awk '/^Version:/ {print $2}') with cuda transports"
  else
    echo "openmpi $(dpkg-query -W -f='${Version}' openmpi-bin) (Debian's, no CUDA)"
  fi
  # The GPU libraries the binaries link (NEEDED), and cuBLAS/cuBLASLt, which they dlopen() by
  # these sonames when a CUDA runtime starts (src/tensor/cuda/cublas_loader.h).
  cublas_major=$(def CUBLAS_VER_MAJOR "$inc/cublas_api.h")
  echo "needs $({ for b in "$B"/bin/*; do [ -L "$b" ] || readelf -d "$b"; done | awk '/NEEDED/ {gsub(/[][]/, "", $5); print $5}'
    echo "libcublas.so.$cublas_major"; echo "libcublasLt.so.$cublas_major"; } | grep -E '^lib(cublas|nccl|cuda)' | sort -u | tr '\n' ' ')"
} >"$B/BUILD-INFO"

tar -C "$stage" -cf - fsdp-gpu | xz -T2 -9 >"$archive.tmp"
mv "$archive.tmp" "$archive"
size=$(stat -c %s "$archive")
echo "gpu-bundle: $archive $size bytes ($(awk -v s="$size" 'BEGIN {printf "%.1f", s / 1048576}') MiB;" \
  "unpacked $(du -sm "$B" | cut -f1) MiB), packed in $(($(date +%s) - t1)) s"
if [ "$size" -gt $limit ]; then
  echo "gpu-bundle: $archive is over the 48 MiB limit" >&2
  exit 1
fi
