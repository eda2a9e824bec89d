#!/usr/bin/env bash
# jobs/plot-bench.sh CSV [OUT.png]: draws fsdp_bench --csv output as bus bandwidth against
# message size (log scale), one line per backend and collective, the raw-MPI baseline included
# (dashed). OUT defaults to the CSV's name with .png. Needs gnuplot (jobs/install-deps.sh).
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: jobs/plot-bench.sh CSV [OUT.png]" >&2
  exit 2
fi
csv=$1
out=${2:-${csv%.csv}.png}
[ -r "$csv" ] || { echo "plot-bench: cannot read $csv" >&2; exit 1; }
command -v gnuplot >/dev/null || { echo "plot-bench: gnuplot not found (bash jobs/install-deps.sh)" >&2; exit 1; }
header=$(head -1 "$csv")
[ "${header%%,*}" = backend ] || { echo "plot-bench: $csv is not fsdp_bench --csv output (header: $header)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One data file per (backend, op): columns size_bytes busbw_GBps, rows in size order.
awk -F, -v dir="$tmp" 'NR > 1 && $3 > 0 {
  key = $1 "__" $2
  if (!(key in seen)) { seen[key] = 1; order[++n] = key }
  print $3, $8 > (dir "/" key ".dat")
  dtype = $5
} END {
  for (i = 1; i <= n; ++i) print order[i] > (dir "/series")
  print dtype > (dir "/dtype")
}' "$csv"
[ -s "$tmp/series" ] || { echo "plot-bench: $csv has no rows" >&2; exit 1; }
dtype=$(cat "$tmp/dtype")
rows=$(($(wc -l <"$csv") - 1))

# One colour per collective; one point type and dash pattern per backend (raw MPI dashed).
plot=""
declare -A colour=([all_gather]='#1f77b4' [reduce_scatter]='#d62728' [all_reduce]='#2ca02c')
declare -A point=() dashes=([mpi-raw]=2)
next_point=5 next_dash=1
while read -r key; do
  backend=${key%%__*}
  op=${key#*__}
  if [ -z "${point[$backend]:-}" ]; then point[$backend]=$next_point; next_point=$((next_point + 2)); fi
  if [ -z "${dashes[$backend]:-}" ]; then dashes[$backend]=$next_dash; next_dash=$((next_dash == 1 ? 4 : next_dash + 1)); fi
  dash=${dashes[$backend]}
  plot+="${plot:+, }'$tmp/$key.dat' using 1:2 with linespoints lw 2 pt ${point[$backend]} ps 0.8 dt $dash lc rgb '${colour[$op]:-#555555}' title '$backend $op'"
done <"$tmp/series"

gnuplot <<GP
set terminal pngcairo size 1200,750 noenhanced font 'DejaVu Sans,11'
set output '$out'
set title "fsdp_bench: bus bandwidth ($dtype, $rows rows, $(basename "$csv"))"
set logscale x 2
set format x '%.0b%BB'
set xlabel 'size (bytes, whole array)'
set ylabel 'busbw (GB/s)'
set yrange [0:*]
set grid xtics ytics
set key outside right top box
plot $plot
GP
echo "plot-bench: wrote $out"
