#!/usr/bin/env bash
# Fuzzes every input reader for a bounded time: configures and builds the libFuzzer build (clang,
# AddressSanitizer + UndefinedBehaviorSanitizer, -Dfuzz=enabled), then runs each target on a
# copy of its seed corpus (tests/fuzz/corpus/<target>) plus its saved regressions
# (tests/fuzz/regressions/<target>, replayed first), one target at a time.
#
#   bash tests/fuzz/run.sh [BUILD_DIR] [SECONDS_PER_TARGET] [TARGET...]
#
# BUILD_DIR defaults to build-fuzz (or a sanitizer build that already has the fuzz targets, such
# as tests/sanitize.sh's build-asan: used as configured), SECONDS_PER_TARGET to 60. Per target
# it prints the number of executions and the outcome; a crash, sanitizer report, timeout (> 25 s
# on one input), an allocation over 1 GiB or an RSS over 2 GiB fails the target and prints the
# reproducer path and the command that replays it. Ends with `N passed, N failed`; exits 1 on any failure.
# FUZZ_BUILD_ONLY=1 builds the targets and stops. Targets run FUZZ_JOBS at a time (default: the
# number of cores; each libFuzzer is one process; a file's path: the number it holds, read as each
# target starts), each for the full SECONDS_PER_TARGET.
#
# A reproducer becomes a regression: fix the reader, then copy the file into
# tests/fuzz/regressions/<target>/ (the normal build replays it as the meson test
# fuzz_replay_<target>; so does this script, under the sanitizers).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${1:-build-fuzz}"
seconds="${2:-60}"
shift $(( $# < 2 ? $# : 2 ))
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(config idx text seq2seq csv ckpt_raw ckpt_struct safetensors causal_lm)
case "$build" in /*) ;; *) build="$root/$build" ;; esac

# Per target libFuzzer options. The checkpoint targets run MPI_Init (one rank), whose Open MPI /
# PMIx / hwloc allocations are never freed and come from unloaded plugins (unnamed frames that no
# suppression can match): leak detection is off for them only.
# ckpt_raw feeds damaged files to libhdf5 itself, which is not instrumented and crashes on some
# (Debian 12's HDF5 1.10.8 has known out-of-bounds reads on malformed metadata, e.g. H5HG_read
# on a bad global-heap index): it runs in fork mode, going on after a crash, and every crash is
# replayed and classified below (classify). A crash, timeout or out-of-memory whose first frame
# outside libFuzzer, the sanitizer runtime and libc is in libhdf5 is reported as an HDF5 bug with
# its reproducer but does not fail the target; anything else that recurs when replayed does (all HDF5 ones seen so far:
# variable-length string attributes, H5T__conv_vlen / H5HG_read on a damaged global heap).
declare -A extra=(
  [ckpt_raw]="-max_len=65536 -detect_leaks=0 -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1"
  [ckpt_struct]="-max_len=256 -detect_leaks=0"
  [safetensors]="-max_len=4096"
)

# classify EXE INPUT ASAN_OPTIONS: replays INPUT alone (a hang: for 5 s) and prints
#   hdf5   the failure is inside libhdf5 or a filter library it calls (zlib, szip/libaec): the
#          first stack frame not libFuzzer's, the sanitizer runtime's, an allocator's or libc's
#          is theirs, or the first frame is in no known module and libhdf5 is on the stack (a
#          jump through a pointer HDF5 read from the damaged file);
#   alone  the replay does not fail: the crash needed state left by the inputs before it in the
#          same fork-mode job. Uninstrumented libhdf5 writes out of bounds on some damaged files
#          without a report and fails later, anywhere; our readers keep no state between calls.
#          Reported with the reproducer, not counted as ours (nothing to fix or replay);
#   ours   anything else.
classify() {
  local out frames frame
  # -rss_limit_mb=8192: an out-of-memory replayed under the default 2 GB RSS limit may trip that
  # limit before the one huge malloc (libhdf5's H5T__conv_vlen asking 21 GB for a damaged vlen
  # attribute, after 2.2 GB of smaller pieces), and an RSS report has no stack of the culprit; the
  # malloc limit reports the allocating frames.
  if out=$(ASAN_OPTIONS="$3" timeout 60 "$1" -timeout=5 -malloc_limit_mb=1024 -rss_limit_mb=8192 "$2" 2>&1); then
    echo alone
    return
  fi
  frames=$(grep -E '^ +#[0-9]+ 0x[0-9a-f]+ ' <<<"$out" \
    | grep -vE ' in (fuzzer::|__asan|__interceptor_|__sanitizer|__ubsan|__lsan|__libc_|__mem|__str)| in (mem(cpy|move|set|cmp)|str[a-z]*|(m|c|re)alloc|free|operator new|operator delete)[ (]|/libc\.so')
  frame=$(head -1 <<<"$frames")
  if [[ "$frame" == *libhdf5* || "$frame" == *libz.so* || "$frame" == *libsz.so* || "$frame" == *libaec.so* ]] ||
     { [[ "$frame" == *"<unknown module>"* ]] && [[ "$frames" == *libhdf5* ]]; }; then
    echo hdf5
  else
    echo ours
  fi
}

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (bash jobs/install-deps.sh --tests)"; exit 1; }
options=(-Dfuzz=enabled -Dtests=disabled -Db_sanitize=address,undefined -Db_lundef=false
         -Dbuildtype=plain "-Dcpp_args=-O1 -g" -Dgpu=disabled -Ducx=disabled)
# sanitizer_fuzz_build: BUILD is already a sanitizer build with the fuzz targets, e.g.
# tests/sanitize.sh's (clang, ASan+UBSan, -Dfuzz=enabled, tests on): .ci/run compiles the library
# once under the sanitizers for both stages. Such a build is used as it is.
sanitizer_fuzz_build() {
  meson introspect --buildoptions "$build" 2>/dev/null | /usr/bin/python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
san = o.get("b_sanitize", "none")
san = ",".join(san) if isinstance(san, list) else san
sys.exit(0 if o.get("fuzz") == "enabled" and "address" in san and "undefined" in san else 1)'
}
if [ -f "$build/build.ninja" ] && sanitizer_fuzz_build; then
  echo "fuzz: using $build as configured (a sanitizer build with -Dfuzz=enabled)"
elif [ -f "$build/build.ninja" ]; then
  meson setup --reconfigure "$build" "$root" "${options[@]}" >/dev/null || exit 1
else
  CXX=clang++ CXX_LD=lld meson setup "$build" "$root" "${options[@]}" >/dev/null || exit 1
fi
start=$SECONDS
meson compile -C "$build" "${targets[@]/#/fuzz_}" >"$build/fuzz-build.log" 2>&1 || {
  tail -40 "$build/fuzz-build.log"; echo "fuzz: build failed"; exit 1; }
echo "fuzz: built ${#targets[@]} targets in $((SECONDS - start)) s ($build)"
# FUZZ_BUILD_ONLY=1: stop here (build now, fuzz later).
if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then exit 0; fi

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="abort_on_error=0:detect_stack_use_after_return=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
work="$(mktemp -d "${TMPDIR:-/tmp}/fsdp_fuzz_run.XXXXXX")"
trap 'rm -rf "$work"' EXIT
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"

# Reproducers libFuzzer wrote into a folder, sorted (for comm).
list_artifacts() {
  find "$1" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort
}

# fuzz_target T: fuzzes T for $seconds s and writes its report to $work/T.report and PASS or FAIL
# to $work/T.status. libFuzzer runs one process (ckpt_raw: one fork-mode worker), so targets run
# FUZZ_JOBS at a time (default: the number of cores), each still for its full $seconds.
fuzz_target() {
  local t=$1 exe corpus dirs asan log before_list rc runs kind f
  exe="$build/tests/fuzz/fuzz_$t"
  corpus="$work/$t"
  mkdir -p "$corpus" "$artifacts/$t"
  cp "$here/corpus/$t/"* "$corpus/" 2>/dev/null
  dirs=("$corpus")
  [ -d "$here/regressions/$t" ] && dirs+=("$here/regressions/$t")
  asan="$ASAN_OPTIONS"
  case " ${extra[$t]:-} " in *" -detect_leaks=0 "*) asan="detect_leaks=0:$asan" ;; esac
  log="$artifacts/$t/fuzz.log"
  before_list=$(list_artifacts "$artifacts/$t")
  # shellcheck disable=SC2086
  ASAN_OPTIONS="$asan" "$exe" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$artifacts/$t/" ${extra[$t]:-} \
    "${dirs[@]}" >"$log" 2>&1
  rc=$?
  # Executions: the final stats (-print_final_stats), else "Done N runs", else the last status
  # line ("#N ..." in-process, "#N: cov: ..." in fork mode).
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [ -z "$runs" ] && runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
  [ -z "$runs" ] && runs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  local ours=() hdf5=() alone=()
  while read -r f; do
    [ -z "$f" ] && continue
    kind=ours
    [[ "$t" == ckpt_* ]] && kind=$(classify "$exe" "$f" "$asan")
    case "$kind" in
      hdf5) hdf5+=("$f") ;;
      alone) alone+=("$f") ;;
      *) ours+=("$f") ;;
    esac
  done < <(comm -13 <(echo "$before_list") <(list_artifacts "$artifacts/$t"))
  {
    # A crash may leave no artifact (an abort in libFuzzer itself): the exit status still counts.
    if [ ${#ours[@]} -eq 0 ] && { [ $rc -eq 0 ] || [ $((${#hdf5[@]} + ${#alone[@]})) -gt 0 ]; }; then
      echo PASS >"$work/$t.status"
      printf 'fuzz %-12s PASS  %s runs in %s s, 0 crashes' "$t" "${runs:-0}" "$seconds"
      [ ${#hdf5[@]} -gt 0 ] && printf ' (%s crash(es) inside libhdf5, not ours)' "${#hdf5[@]}"
      [ ${#alone[@]} -gt 0 ] && printf ' (%s crash(es) that do not recur when replayed alone)' "${#alone[@]}"
      echo
    else
      echo FAIL >"$work/$t.status"
      printf 'fuzz %-12s FAIL  %s runs, %s crash(es), exit %s\n' "$t" "${runs:-0}" "${#ours[@]}" "$rc"
      grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|broken promise|terminate called' "$log" \
        | sed 's/^/    /'
      for f in "${ours[@]}"; do
        echo "    reproducer: $f"
        echo "    replay:     ASAN_OPTIONS=$asan $exe $f"
      done
      echo "    log:        $log"
    fi
    for f in "${hdf5[@]}"; do
      echo "    libhdf5 crash (HDF5 bug on a damaged file): $f"
    done
    for f in "${alone[@]}"; do
      echo "    crash after earlier inputs, passes alone (state left by libhdf5?): $f"
    done
  } >"$work/$t.report"
}

# FUZZ_JOBS: a number, or a file holding one, read again before each target starts (.ci/run
# writes 1 while its sanitize stage runs beside this, then the number of cores: the last targets
# then share the cores that stage leaves). Not nproc: it prints OMP_NUM_THREADS when that is set
# (1, exported above).
jobs_max() {
  local n=${FUZZ_JOBS:-$(getconf _NPROCESSORS_ONLN)}
  [ -f "$n" ] && n=$(cat "$n")
  [[ "$n" =~ ^[1-9][0-9]*$ ]] && echo "$n" || echo 1
}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(jobs_max)" ]; do sleep 1; done
  fuzz_target "$t" &
done
wait
passed=0
failed=0
for t in "${targets[@]}"; do
  cat "$work/$t.report" 2>/dev/null || echo "fuzz $t: no report (the runner died)"
  if [ "$(cat "$work/$t.status" 2>/dev/null)" = PASS ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
