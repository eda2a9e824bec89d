#!/usr/bin/env bash
# Checkpoint benchmark (not a test): save and load of the 1.07 GB training state of
# input/ckpt_bench.yaml at np ranks, both formats, both MPI-IO transfer modes, next to `dd`
# writing (conv=fsync) and reading the same number of bytes in the same folder in the same run.
# dd writes a copy of the checkpoint just saved (read into the page cache first), not /dev/zero:
# this VM's disk takes runs of zeros far slower than real data, which would flatter us. Every
# timed save, load, dd write and dd read starts after `sync; drop_caches`, because here the
# first writer after a drop pays for the page cache's pages (we saw 0.5-2 GB/s for the same
# write): all four measurements pay alike.
# Saves include CRCs, the read-back verification, fsync and the rename; loads include the CRC
# check. When the page cache can be dropped (root), every read starts cold, ours and dd's alike.
#   bash jobs/bench-ckpt.sh [--build DIR] [--np N] [--dir FOLDER] [--repeat R]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build np=4 dir=${TMPDIR:-/tmp} repeat=2
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "bench-ckpt: unknown argument $1 (try --help)" >&2; exit 1 ;;
  esac
done
bash jobs/build.sh "$build" || exit 1  # errors shown, with what to do next
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d "$dir/bench-ckpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
drop_caches() { sync; echo 3 2>/dev/null >/proc/sys/vm/drop_caches && echo cold || echo warm; }
app() { timeout 900 mpirun -np "$np" --oversubscribe --bind-to none "$build/apps/fsdp_app" input/ckpt_bench.yaml "$@"; }
gbps() { /usr/bin/python3 -c "import sys; print(f'{float(sys.argv[1]) / 1e9 / float(sys.argv[2]):.3f}')" "$1" "$2"; }
# dd: seconds for writing (with fsync) the bytes of file $2, or reading them back.
dd_s() {
  local what=$1 src=$2 t0 t1
  t0=$(date +%s.%N)
  if [ "$what" = write ]; then dd if="$src" of="$tmp/dd.bin" bs=4M conv=fsync status=none
  else dd if="$tmp/dd.bin" of=/dev/null bs=4M status=none; fi
  t1=$(date +%s.%N)
  /usr/bin/python3 -c "print(f'{$t1 - $t0:.4f}')"
}
echo "bench-ckpt: np=$np, $(nproc --all) cores, folder $dir ($(df -h "$dir" | awk 'NR==2{print $1}'))"
printf '%-13s %-11s %12s %9s %9s %7s %6s %9s %9s %7s\n' format io bytes save_GB/s dd_w_GB/s save/dd cache load_GB/s dd_r_GB/s load/dd
for r in $(seq "$repeat"); do
  for format in consolidated sharded; do
    for io in collective independent; do
      ck="$tmp/ck_${format}_${io}"
      rm -rf "$ck"
      drop_caches >/dev/null
      app --set checkpoint.dir="$ck" --set checkpoint.format=$format --set checkpoint.io=$io \
        --set output.metrics="$ck/m.jsonl" >"$tmp/save.log"
      read -r bytes save_s < <(/usr/bin/python3 -c "
import json,sys
e=[json.loads(l) for l in open('$ck/m.jsonl') if 'checkpoint' in l][-1]
print(e['bytes'], e['save_s'])")
      src=$(ls "$ck"/ckpt_*.h5)
      drop_caches >/dev/null
      cat "$src" >/dev/null
      ddw=$(dd_s write "$src")
      cache=$(drop_caches)
      app --set checkpoint.dir="$ck" --set checkpoint.resume=auto >"$tmp/load.log"
      load_s=$(sed -n 's/.*MB in \([0-9.]*\) s$/\1/p' "$tmp/load.log" | head -1)
      drop_caches >/dev/null
      ddr=$(dd_s read "$tmp/dd.bin")
      rm -f "$tmp/dd.bin"
      printf '%-13s %-11s %12s %9s %9s %7s %6s %9s %9s %7s\n' $format $io "$bytes" "$(gbps "$bytes" "$save_s")" \
        "$(gbps "$bytes" "$ddw")" "$(/usr/bin/python3 -c "print(f'{$ddw / $save_s:.2f}')")" "$cache" \
        "$(gbps "$bytes" "$load_s")" "$(gbps "$bytes" "$ddr")" "$(/usr/bin/python3 -c "print(f'{$ddr / $load_s:.2f}')")"
      rm -rf "$ck"
    done
  done
done
