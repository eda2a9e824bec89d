#!/usr/bin/env bash
# Static analysis gates, each with its checked-in configuration:
#   clang-tidy    .clang-tidy, over the compile database's entries in src/ backends/ apps/
#   cppcheck      tests/lint/cppcheck.supp (+ inline `cppcheck-suppress`), the same entries
#   clang-format  .clang-format, --dry-run over every C++/CUDA source in src backends apps tests
# Prints per tool the files checked and the findings, and ends with "N passed, N failed" (one
# per tool); exits non-zero on any finding.
# Usage: bash tests/lint.sh [BUILD_DIR]   (default build-lint, configured here if missing: only
# its compile_commands.json is used, nothing is compiled). LINT_JOBS=N sets the parallelism (2).
# LINT_ANALYZER_MODE=deep|shallow (default shallow): the depth of clang-tidy's clang-analyzer-*
# checks (the Clang Static Analyzer's -analyzer-config mode). Every checker runs on every file in
# both; shallow inlines only small callees (max-inlinable-size 4 vs 100) and explores at most
# 75,000 nodes per top-level function (vs 225,000). Measured on 5 of our heaviest files
# (clang-tidy 14, 2 cores): analyzer 78.8 s deep vs 38.3 s shallow, the other checks 60.8 s;
# the whole lint 2,250 CPU-s deep, the largest item of CI. Both find nothing in the tree today;
# run deep before a release or after touching ownership/lifetime code (README, Quality).
# The lint cache: clang-tidy and cppcheck analyse only the translation units whose key is not in
# tests/lint/clean.txt, the units a recorded run found nothing in; a key changes with the unit's
# preprocessed text, our files it includes, its flags and the tool's version and configuration
# (tests/lint/lint_cache.py). Analysing all 109 units is about 1,500 CPU-s, the largest item of
# CI; a change that touches a few units costs their share. LINT_FULL=1 analyses every unit;
# LINT_RECORD=1 writes this run's clean units into tests/lint/clean.txt (commit it with the
# change; stale lines only cost time). $BUILD/lint-clean.txt is always the updated list.
# Installs the tools first (jobs/install-deps.sh), as tests/run.sh does.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${1:-build-lint}
jobs=${LINT_JOBS:-2}
analyzer_mode=${LINT_ANALYZER_MODE:-shallow}
case "$analyzer_mode" in deep | shallow) ;; *)
  echo "LINT_ANALYZER_MODE must be deep or shallow, not '$analyzer_mode'"; echo "0 passed, 3 failed"; exit 1 ;;
esac

bash jobs/install-deps.sh --tests-build || { echo "install-deps failed"; echo "0 passed, 3 failed"; exit 1; }
if [ ! -f "$build/compile_commands.json" ]; then
  if [ ! -e "$build" ]; then
    # The GPU build's cuDNN attention (src/tensor/cuda/cudnn_attention.cpp) enters the database
    # only with the cuDNN frontend's headers (jobs/cudnn-frontend.sh: PyPI, cached). Without them
    # (or without cudnn.h) the build is configured without it, and this says the file is unchecked.
    # -Dnative_arch=false: without -march=native the database, and so the lint cache's keys, do
    # not depend on the CPU of the machine that runs lint. -D(mpi_)tests_optimization=build and
    # -Dapps_optimization=build: the test and app sources get the lint build's flags whatever the
    # options' defaults (a new default would otherwise change every such unit's key). -Db_pch=false: each unit is analysed as written,
    # without the library's precompiled header (so a missing include is found), with its flags;
    # -Dunity_library=false: the database names each unit, not the unity files that group them.
    lint_options=(-Dnative_arch=false -Dtests_optimization=build -Dmpi_tests_optimization=build -Dapps_optimization=build -Db_pch=false -Dunity_library=false)
    if fe=$(bash jobs/cudnn-frontend.sh 2>&1) && meson setup "$build" "${lint_options[@]}" -Dcudnn_frontend_include="$fe" >"$build.setup.log" 2>&1; then
      :
    else
      echo "lint: src/tensor/cuda/cudnn_attention.cpp not checked: $( (echo "$fe"; tail -3 "$build.setup.log" 2>/dev/null) | grep -m1 -iE 'error|cudnn-frontend:|cannot' | cut -c1-200)"
      rm -rf "$build"
      meson setup "$build" "${lint_options[@]}" >/dev/null || { echo "meson setup $build failed"; echo "0 passed, 3 failed"; exit 1; }
    fi
  else
    echo "$build/compile_commands.json not found (configure it with meson setup)"
    echo "0 passed, 3 failed"
    exit 1
  fi
fi
# The database as the current meson.build makes it; one that groups the units into unity files
# (a build-lint set up by hand, or before -Dunity_library existed, regenerated since) is
# reconfigured: clang-tidy and cppcheck analyse each unit under its own name.
ninja -C "$build" build.ninja >/dev/null 2>&1
if grep -q -- 'fsdp-unity[0-9]*\.cpp' "$build/compile_commands.json"; then
  echo "lint: $build groups units into unity files; reconfiguring it with -Dunity_library=false"
  meson configure "$build" -Dunity_library=false >/dev/null && ninja -C "$build" build.ninja >/dev/null ||
    { echo "cannot reconfigure $build (remove it and run again)"; echo "0 passed, 3 failed"; exit 1; }
fi
if grep -q -- '-march=native' "$build/compile_commands.json"; then
  echo "lint: $build was configured with -march=native; reconfiguring it with -Dnative_arch=false (the cache's keys must not depend on the CPU)"
  meson configure "$build" -Dnative_arch=false >/dev/null && ninja -C "$build" build.ninja >/dev/null ||
    { echo "cannot reconfigure $build (remove it and run again)"; echo "0 passed, 3 failed"; exit 1; }
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
# Args: tool name, files checked, findings (unique diagnostics), log to show when there are any.
report() {
  local tool=$1 files=$2 findings=$3 log=$4 status=$5
  case "$files" in 0 | "0 files"*) status=1; echo "$tool: no files to check" ;; esac
  if [ "$findings" -gt 0 ] || [ "$status" -ne 0 ]; then
    if [ -s "$log" ]; then
      # Paths relative to the repository root.
      sed -E "s#/[^/ ]+/\.\./#/#g; s#$root/##g" "$log" | head -n 400
      [ "$(wc -l <"$log")" -gt 400 ] && echo "... ($(wc -l <"$log") lines in all)"
    fi
    echo "$tool: $files, $findings findings: FAILED"
    failed=$((failed + 1))
  else
    echo "$tool: $files, 0 findings: ok"
    passed=$((passed + 1))
  fi
}

# The compile database's entries under src/ backends/ apps/ (generated sources in the build dir
# are not ours): a database of only those, with absolute paths, for both analysers.
python3 - "$build/compile_commands.json" "$root" "$work" <<'EOF'
import json, os, sys
db_path, root, work = sys.argv[1:]
keep, files = [], []
for e in json.load(open(db_path)):
    path = os.path.normpath(os.path.join(e["directory"], e["file"]))
    rel = os.path.relpath(path, root)
    if rel.split(os.sep)[0] in ("src", "backends", "apps") and os.path.exists(path) and path not in files:
        e = dict(e, file=path)
        keep.append(e)
        files.append(path)
json.dump(keep, open(os.path.join(work, "compile_commands.json"), "w"), indent=1)
open(os.path.join(work, "files.txt"), "w").write("".join(f + "\n" for f in files))
EOF
[ -f "$work/files.txt" ] || { echo "cannot read $build/compile_commands.json"; echo "0 passed, 3 failed"; exit 1; }
nfiles=$(wc -l <"$work/files.txt")

# A diagnostic line is `path:line:col: warning|error: text [check]`; a header's finding repeats in
# every translation unit that includes it, so findings are counted once each (paths normalised).
count_unique() { grep -E ': (warning|error): ' "$1" | sed -E 's#/[^/ ]+/\.\./#/#g' | sort -u | tee "$1.unique" | wc -l; }

# The cache's keys, one per unit; without them (no clang++) every unit is analysed.
manifest=tests/lint/clean.txt
[ "${LINT_FULL:-0}" = 1 ] && manifest=/dev/null
cache="python3 tests/lint/lint_cache.py"
if ! $cache keys "$work/compile_commands.json" "$root" "$jobs" "$work/keys" 2>"$work/keys.log"; then
  echo "lint: no cache keys ($(head -1 "$work/keys.log")): every unit is analysed"
  sed 's/^/none /' "$work/files.txt" >"$work/keys"
fi
cp "$manifest" "$build/lint-clean.txt" 2>/dev/null || : >"$build/lint-clean.txt"
# units_note TODO: "N files" or "N files (K analysed, the rest unchanged since the manifest)".
units_note() {
  local todo_count
  todo_count=$(wc -l <"$1")
  if [ "$todo_count" -eq "$nfiles" ]; then echo "$nfiles files"; else
    echo "$nfiles files ($todo_count analysed, $((nfiles - todo_count)) unchanged since $manifest)"; fi
}
# record TOOL SALT CLEAN: the units listed in file CLEAN are clean for TOOL ($build/lint-clean.txt).
record() { $cache record "$1" "$2" "$work/keys" "$3" "$build/lint-clean.txt"; }

# clang-tidy: one process per translation unit, $jobs at a time. -Wno-unknown-warning-option:
# the database holds GCC's flags, and a GCC-only warning option is not a finding.
tidy_args=(--quiet --extra-arg=-Wno-unknown-warning-option --extra-arg=-Xclang --extra-arg=-analyzer-config
  --extra-arg=-Xclang --extra-arg="mode=$analyzer_mode")
if command -v clang-tidy >/dev/null; then
  mkdir -p "$work/tidy"
  tidy_salt="$(clang-tidy --version) $(clang++ --version 2>&1) ${tidy_args[*]} $(cat .clang-tidy)"
  $cache split clang-tidy "$tidy_salt" "$work/keys" "$manifest" "$work/tidy.todo" >/dev/null
  tr '\n' '\0' <"$work/tidy.todo" | xargs -0 -r -P "$jobs" -I{} sh -c \
    'w=$1 f=$2 logs=$3; shift 3; clang-tidy -p "$w" "$@" "$f" >"$logs/$(echo "$f" | tr / _).log" 2>&1 || echo "$f" >>"$logs/crashed"' \
    _ "$work" {} "$work/tidy" "${tidy_args[@]}"
  cat "$work"/tidy/*.log >"$work/tidy.log" 2>/dev/null || : >"$work/tidy.log"
  tidy_findings=$(count_unique "$work/tidy.log")
  # clang-tidy exits non-zero on a compile error (counted above) or a crash; show which file.
  tidy_status=0
  if [ -f "$work/tidy/crashed" ] && [ "$tidy_findings" -eq 0 ]; then
    tidy_status=1
    { echo "clang-tidy failed on:"; cat "$work/tidy/crashed"; } >>"$work/tidy.log"
  fi
  # Clean: every unit but those analysed with a finding in their own log, or a crash.
  while read -r f; do
    log="$work/tidy/$(echo "$f" | tr / _).log"
    grep -qE ': (warning|error): ' "$log" 2>/dev/null || grep -qxF "$f" "$work/tidy/crashed" 2>/dev/null || echo "$f"
  done <"$work/files.txt" >"$work/tidy.clean"
  record clang-tidy "$tidy_salt" "$work/tidy.clean"
  report "clang-tidy (analyzer $analyzer_mode)" "$(units_note "$work/tidy.todo")" "$tidy_findings" "$work/tidy.log" "$tidy_status"
else
  echo "clang-tidy: not installed (bash jobs/install-deps.sh --tests)"
  failed=$((failed + 1))
fi

# cppcheck: the same translation units (their own headers included) with the database's flags.
cppcheck_args=(--enable=warning,performance,portability --library=posix --library=gnu --library=openmp
  --library=zlib --inline-suppr --suppressions-list=tests/lint/cppcheck.supp --error-exitcode=1)
if command -v cppcheck >/dev/null; then
  cppcheck_salt="$(cppcheck --version) ${cppcheck_args[*]} $(cat tests/lint/cppcheck.supp)"
  $cache split cppcheck "$cppcheck_salt" "$work/keys" "$manifest" "$work/cppcheck.todo" >/dev/null
  python3 -c 'import json, sys
todo = set(open(sys.argv[2]).read().split("\n"))
json.dump([e for e in json.load(open(sys.argv[1])) if e["file"] in todo], open(sys.argv[3], "w"))' \
    "$work/compile_commands.json" "$work/cppcheck.todo" "$work/cppcheck_db.json"
  cppcheck_status=0
  : >"$work/cppcheck.log"
  if [ -s "$work/cppcheck.todo" ]; then
    cppcheck --project="$work/cppcheck_db.json" "${cppcheck_args[@]}" -j "$jobs" --quiet \
      --template='{file}:{line}:{column}: warning: {message} [{id}] ({severity})' >"$work/cppcheck.log" 2>&1
    cppcheck_status=$?
  fi
  cppcheck_findings=$(count_unique "$work/cppcheck.log")
  # A finding in a header cannot be pinned on one unit: clean are the units not analysed, and the
  # analysed ones too only when there was no finding at all.
  if [ "$cppcheck_findings" -eq 0 ] && [ "$cppcheck_status" -eq 0 ]; then cp "$work/files.txt" "$work/cppcheck.clean"; else
    grep -vxF -f "$work/cppcheck.todo" "$work/files.txt" >"$work/cppcheck.clean"; fi
  record cppcheck "$cppcheck_salt" "$work/cppcheck.clean"
  report cppcheck "$(units_note "$work/cppcheck.todo")" "$cppcheck_findings" "$work/cppcheck.log" "$cppcheck_status"
else
  echo "cppcheck: not installed (bash jobs/install-deps.sh --tests)"
  failed=$((failed + 1))
fi

# clang-format: every C++/CUDA source and header we write. Meson's *.in templates are left out
# (their @PLACEHOLDER@ lines are not C++).
if command -v clang-format >/dev/null; then
  find src backends apps tests -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cc' -o -name '*.hpp' \
    -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z >"$work/format-files"
  format_files=$(tr -cd '\0' <"$work/format-files" | wc -c)
  xargs -0 -P "$jobs" -n 16 clang-format --dry-run --Werror <"$work/format-files" >"$work/format.log" 2>&1
  format_status=$?
  # One finding per place that needs reformatting; the log shows each with its line.
  format_findings=$(count_unique "$work/format.log")
  format_bad_files=$(grep -E ': (warning|error): ' "$work/format.log" | cut -d: -f1 | sort -u | wc -l)
  [ "$format_findings" -gt 0 ] && echo "clang-format: $format_bad_files files need formatting (clang-format -i FILE)"
  report clang-format "$format_files files" "$format_findings" "$work/format.log" "$format_status"
else
  echo "clang-format: not installed (bash jobs/install-deps.sh --tests)"
  failed=$((failed + 1))
fi

if [ "${LINT_RECORD:-0}" = 1 ]; then
  cp "$build/lint-clean.txt" tests/lint/clean.txt
  echo "lint: recorded $(grep -vc '^#' tests/lint/clean.txt) clean (tool, unit) pairs in tests/lint/clean.txt"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
