#!/usr/bin/env bash
# Configures a build directory where needed and compiles it; the one build step behind the README's
# two commands (jobs/run-default.sh, tests/run.sh). A failed step prints the error lines of its
# log and one line saying what to do next, never only an exit code.
#
# usage: bash jobs/build.sh [--tests] [--configure-only] BUILD_DIR [TARGET ...]
#   (default)         configure BUILD_DIR if it has no build.ninja (tests: auto, so the Boost.Test
#                     suites are built only where Boost.Test is installed), then compile TARGETs
#                     (none: everything the directory is configured for)
#   --tests           the directory must build the tests: configure with -Dtests=enabled, or
#                     reconfigure a directory that was set up without them (e.g. by
#                     jobs/run-default.sh before the test packages were installed)
#   --configure-only  stop after configuring
# Environment (tests/front_door/test_front_door.sh sets them; a user needs neither):
#   FSDP_CONFIGURE_ONLY=1  as --configure-only, so the test runs the README's two commands up to
#                          their configuration
#   FSDP_SOURCE_ROOT=DIR   the Meson project to build (default: this repository): the test points
#                          it at small broken projects to check the error reports
set -uo pipefail
root=${FSDP_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
tests=0 configure_only=${FSDP_CONFIGURE_ONLY:-0}
while [ $# -gt 0 ]; do
  case $1 in
    --tests) tests=1 ;;
    --configure-only) configure_only=1 ;;
    -*) echo "usage: bash jobs/build.sh [--tests] [--configure-only] BUILD_DIR [TARGET ...]" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -ge 1 ] || { echo "usage: bash jobs/build.sh [--tests] [--configure-only] BUILD_DIR [TARGET ...]" >&2; exit 2; }
build=$1
shift
cd "$root" || exit 1
mkdir -p "$build"
build=$(cd "$build" && pwd)

# report LOG WHAT NEXT: the log's error lines (the compiler's `error:` lines with their context,
# Meson's ERROR lines), else its last lines, then one line naming the failed step and the next move.
report() {
  local log=$1 what=$2 next=$3
  echo "---- $what: the errors (full log: $log) ----"
  if grep -qE '(error|ERROR)(:| [A-Z])|undefined reference|FAILED:' "$log"; then
    grep -E -B2 -A3 '(error|ERROR)(:| [A-Z])|undefined reference|FAILED:' "$log" | head -60
  else
    tail -30 "$log"
  fi
  echo "----"
  echo "build.sh: $what failed; next: $next"
}

# The value of Meson option NAME in the configured BUILD_DIR.
option_value() {
  meson introspect "$build" --buildoptions 2>/dev/null |
    /usr/bin/python3 -c 'import json, sys; print(next((o["value"] for o in json.load(sys.stdin) if o["name"] == sys.argv[1]), ""))' "$1"
}

setup_log=$build/setup.log
setup_args=()
[ $tests -eq 1 ] && setup_args=(-Dtests=enabled)
if [ ! -f "$build/build.ninja" ]; then
  if ! meson setup "$build" "${setup_args[@]}" >"$setup_log" 2>&1; then
    report "$setup_log" "meson setup $build" \
      "install what the error names (bash jobs/install-deps.sh$([ $tests -eq 1 ] && echo " --tests")), then rerun; a half-made $build can be removed (rm -rf $build)"
    exit 1
  fi
elif [ $tests -eq 1 ] && [ "$(option_value tests)" != enabled ]; then
  # Set up without the tests (Boost.Test was not installed then): Meson found it absent and left
  # tests/ out; a reconfigure with the option forced looks again.
  if ! meson setup --reconfigure "$build" "${setup_args[@]}" >"$setup_log" 2>&1; then
    report "$setup_log" "meson setup --reconfigure $build -Dtests=enabled" \
      "install the test packages (bash jobs/install-deps.sh --tests), then rerun; or start over: rm -rf $build"
    exit 1
  fi
fi
[ $configure_only -eq 1 ] && exit 0

compile_log=$build/compile.log
if ! meson compile -C "$build" "$@" >"$compile_log" 2>&1; then
  report "$compile_log" "meson compile -C $build${*:+ $*}" \
    "fix the first error above; if $build was configured on another machine or with other packages, start over: rm -rf $build"
  exit 1
fi
