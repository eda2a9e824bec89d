#!/usr/bin/env bash
# The README's two commands as a new user runs them: in a fresh Debian 12 (bookworm) root made by
# `debootstrap --variant=minbase` (nothing of the project's installed), a clone of this repository's
# committed HEAD, then `bash jobs/run-default.sh` and `bash tests/run.sh` in that order, in the same
# clone. Prints each command's wall time, exit code and last lines; the full logs stay in OUT_DIR.
# Run by hand (root, network to Debian's archive and PyPI; about an hour on 2 cores), not in CI.
#
# usage: bash tests/fresh_machine.sh [--out OUT_DIR] [--keep] [--no-cuda] [--reverse | --cuda-mpi]
#   --out DIR   where the logs and the summary go (default /tmp/fresh_machine.<date>)
#   --keep      keep the root afterwards (OUT_DIR/root) for a look inside
#   --no-cuda   do not bind this machine's CUDA toolkit (/usr/local/cuda) into the root. By default
#               it is bound read-only, as the machines this project runs on have it installed
#               outside Debian's packages; the build then compiles the GPU path with nvcc too
#   --reverse   run the two commands in the other order (tests/run.sh first)
#   --cuda-mpi  instead of the two commands, `bash jobs/cuda-aware-mpi.sh --check`: the CUDA-aware
#               Open MPI and UCX built from nothing, the apps built on them, a job at np 2
#
# The root gets what the machine image gives every fresh machine and Debian's minbase lacks: the
# apt sources (this machine's, so the same archive), DNS (resolv.conf), pip's configuration and the
# CA bundle it names. Nothing else of the host is visible: /proc, /sys, /dev (and a private
# /dev/shm) are mounted in a private mount namespace and go away with it.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=/tmp/fresh_machine.$(date +%Y%m%d-%H%M%S)
keep=0 cuda=1 order=(jobs/run-default.sh tests/run.sh)
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift ;;
    --keep) keep=1 ;;
    --no-cuda) cuda=0 ;;
    --reverse) order=(tests/run.sh jobs/run-default.sh) ;;
    --cuda-mpi) order=("jobs/cuda-aware-mpi.sh --check") ;;
    *) echo "usage: bash tests/fresh_machine.sh [--out OUT_DIR] [--keep] [--no-cuda] [--reverse | --cuda-mpi]" >&2; exit 2 ;;
  esac
  shift
done
die() { echo "fresh_machine: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mounts)"
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
root=$out/root
[ -e "$root" ] && die "$root exists (remove it, or give another --out)"
git -C "$src" diff --quiet HEAD 2>/dev/null || echo "fresh_machine: note: uncommitted changes are not in the clone (it takes HEAD)"

if ! command -v debootstrap >/dev/null; then
  apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null ||
    die "cannot install debootstrap"
fi
# The archive this machine's apt uses (deb822 .sources or one-line sources.list).
mirror=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | head -1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
[ -n "$mirror" ] || die "no Debian archive found in /etc/apt/sources.list{,.d}"

t0=$(date +%s)
echo "fresh_machine: debootstrap --variant=minbase bookworm ($out/debootstrap.log)"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$out/debootstrap.log" 2>&1 || { tail -20 "$out/debootstrap.log"; die "debootstrap failed"; }
echo "fresh_machine: root made in $(($(date +%s) - t0)) s"
# What every fresh machine of this kind has and minbase does not.
if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
  rm -f "$root/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/"
fi
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# The machine's own name resolves locally, as on the machine itself: debootstrap's /etc/hosts has
# only localhost, and every mpirun then waited on DNS for this host's name (about 30 s a launch:
# the e2e suites, hundreds of launches, ran for hours).
cp -L /etc/hosts "$root/etc/hosts"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
# This machine's CA bundle (the image's, with any CA it adds for its network) as a local CA: apt's
# ca-certificates regenerates /etc/ssl/certs/ca-certificates.crt from Debian's CAs and
# /usr/local/share/ca-certificates, so a bundle copied in directly would be lost at the first
# install that pulls ca-certificates in (pip then fails on PyPI's certificate).
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/usr/local/share/ca-certificates/this-machine.crt"
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
git clone -q "$src" "$root/root/fsdp-hpc" || die "git clone failed"
echo "fresh_machine: cloned $(git -C "$root/root/fsdp-hpc" log -1 --format='%h %s' | cut -c1-100)"
[ $cuda -eq 1 ] && [ -d /usr/local/cuda/ ] && mkdir -p "$root/usr/local/cuda"

# run NAME: one of the README's commands inside the root, in a private mount namespace, with a
# bare environment (what a login shell on a fresh machine has), at most 90 minutes.
run() {
  local cmd=$1 log=$out/$(basename "${1%% *}" .sh).log start rc
  start=$(date +%s)
  echo "fresh_machine: bash $cmd ($log)"
  unshare -m --propagation private bash -c '
    r=$1 cuda=$2 cmd=$3
    # The root a mount point of its own, as / is on a machine: the tests that unshare a mount
    # namespace (front_door, gpu_bundle, multihost, fault) change its propagation.
    mount --bind "$r" "$r" &&
      mount -t proc proc "$r/proc" && mount --rbind /sys "$r/sys" && mount --rbind /dev "$r/dev" &&
      mount -t tmpfs -o mode=1777 shm "$r/dev/shm" || exit 90
    [ "$cuda" = 1 ] && [ -d /usr/local/cuda/ ] && mount --rbind -o ro /usr/local/cuda/ "$r/usr/local/cuda"
    exec chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      timeout -k 30 5400 bash -c "cd /root/fsdp-hpc && bash $cmd"
  ' _ "$root" "$cuda" "$cmd" </dev/null >"$log" 2>&1
  rc=$?
  results+=("$(printf '%-22s exit %3d  %5d s' "bash $cmd" "$rc" $(($(date +%s) - start)))")
  echo "fresh_machine: bash $cmd: exit $rc after $(($(date +%s) - start)) s; its last lines:"
  tail -15 "$log" | sed 's/^/    /'
}
results=()
for c in "${order[@]}"; do run "$c"; done

# Daemons a test left in the root (none should be) would keep its files busy.
for p in /proc/[0-9]*; do
  [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null
done
{
  echo "fresh Debian 12 root (debootstrap --variant=minbase), $(nproc) cores, commit $(git -C "$root/root/fsdp-hpc" rev-parse --short HEAD 2>/dev/null || echo "?"), CUDA toolkit bound: $([ $cuda -eq 1 ] && [ -d /usr/local/cuda/ ] && echo yes || echo no)"
  printf '%s\n' "${results[@]}"
  echo "total $(($(date +%s) - t0)) s (debootstrap included)"
} | tee "$out/summary.txt"
[ $keep -eq 1 ] || rm -rf --one-file-system "$root"
echo "fresh_machine: logs in $out"
! grep -qv ' exit   0 ' <(printf '%s\n' "${results[@]}")
