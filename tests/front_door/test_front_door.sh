#!/usr/bin/env bash
# The README's two commands on a machine that has the runtime packages but not yet the test ones
# (what jobs/run-default.sh leaves on a fresh machine), without making a fresh machine:
#
# 1. run-default first, Boost.Test hidden. In a private mount namespace (unshare -m) Boost's
#    headers (/usr/include/boost under an empty tmpfs) and the Boost.Test libraries (/dev/null
#    bound over them) are invisible, as before `jobs/install-deps.sh --tests`. There
#    `bash jobs/run-default.sh` (FSDP_CONFIGURE_ONLY=1: up to its configuration) must configure a
#    build that holds the apps and no test: no test_* target, no test, no compile command under
#    tests/ (the bug of 847412f: tests/ was configured without Boost.Test and the build then died
#    on boost/test/unit_test.hpp). An app's own source (fsdp_app.cpp) compiles there.
# 2. then tests/run.sh in the same build directory, Boost.Test visible again, must reconfigure
#    it with the suites (test_tensor, test_app, ... and meson's tests).
# 3. the reverse order: after run.sh configured a directory, run-default reuses it as it is.
# 4. a failed step says what failed: run-default.sh on a small project whose Meson setup fails
#    (a missing dependency) and on one whose compile fails prints Meson's or the compiler's error
#    line and a `next:` line, and exits non-zero.
#
# usage: test_front_door.sh SOURCE_ROOT    Root only (a mount namespace); skips (exit 77) otherwise.
# Each check prints "ok" or "FAIL"; the last lines are Boost-style counts for tests/summary.py.
set -uo pipefail
root=$(cd "$1" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "front_door needs root (a mount namespace)"
command -v unshare >/dev/null && unshare -m true 2>/dev/null || skip "unshare -m is not available here"
[ -d /usr/include/boost/test ] || skip "Boost.Test is not installed, so there is nothing to hide (bash jobs/install-deps.sh --tests)"

passed=0 failed=0
check() {  # check NAME COMMAND...: one case
  local name=$1
  shift
  if "$@"; then
    echo "ok: $name"
    passed=$((passed + 1))
  else
    echo "FAIL: $name"
    failed=$((failed + 1))
  fi
}

work=$(mktemp -d /tmp/front_door.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 FSDP_CONFIGURE_ONLY=1

# What the build directory would build, from Meson's introspection.
targets() { meson introspect "$1" --targets | /usr/bin/python3 -c 'import json, sys; print("\n".join(sorted(t["name"] for t in json.load(sys.stdin))))'; }
tests_of() { meson introspect "$1" --tests | /usr/bin/python3 -c 'import json, sys; print("\n".join(sorted(t["name"] for t in json.load(sys.stdin))))'; }
has() { grep -qx "$2" <<<"$1"; }
lacks() { ! grep -q "$2" <<<"$1"; }

# 1. run-default with Boost.Test hidden.
hide=(mount -t tmpfs none /usr/include/boost)
libs=$(ls /usr/lib/x86_64-linux-gnu/libboost_unit_test_framework* /usr/lib/x86_64-linux-gnu/libboost_test_exec_monitor* 2>/dev/null)
b1=$work/build-run-default
unshare -m bash -c '
  set -e
  mount --make-rprivate /
  mount -t tmpfs none /usr/include/boost
  for f in $1; do mount --bind /dev/null "$f"; done
  [ ! -e /usr/include/boost/test/unit_test.hpp ] || { echo "Boost.Test still visible"; exit 3; }
  cd "$2"
  FSDP_BUILD_DIR=$3 bash jobs/run-default.sh >"$3.out" 2>&1 || { cat "$3.out"; exit 4; }
  # An app compiles with Boost hidden (the source of fsdp_app: the library and the other apps are
  # the same code tests/run.sh builds, and compiling them here would cost CI minutes).
  ninja -C "$3" apps/fsdp_app.p/fsdp_app.cpp.o >"$3.apps.log" 2>&1 || { tail -20 "$3.apps.log"; exit 5; }
' _ "$libs" "$root" "$b1"
rc=$?
check "run-default.sh configures with Boost.Test hidden (rc $rc)" test $rc -eq 0
if [ $rc -eq 0 ]; then
  t=$(targets "$b1")
  check "run-default's build has the apps" bash -c 'for a in fsdp_app fsdp_ckpt fsdp_bench sgemm_peak; do grep -qx "$a" <<<"$1" || exit 1; done' _ "$t"
  check "run-default's build has no test target" lacks "$t" '^test_'
  check "run-default's build has no test" test -z "$(tests_of "$b1")"
    # Sources appear relative to the build directory (../../work/main/tests/test_tensor.cpp).
  check "no compile command under tests/" lacks "$(ninja -C "$b1" -t commands 2>/dev/null)" 'tests/[a-z_/]*\.cpp\( \|$\)'

  check "meson says why the tests are not built" grep -q "Boost.Test not found: the test suites are not built" "$b1/setup.log"
fi

# 2. run.sh after it, same directory, Boost.Test visible.
(cd "$root" && bash tests/run.sh "$b1" >"$b1.run.out" 2>&1)
rc=$?
check "run.sh reconfigures run-default's build (rc $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -20 "$b1.run.out"
t=$(targets "$b1")
check "run.sh's build has the test suites" bash -c 'for a in test_tensor test_app test_comm; do grep -qx "$a" <<<"$1" || exit 1; done' _ "$t"
check "run.sh's build has meson's tests" has "$(tests_of "$b1")" app
check "run.sh's build compiles tests/" grep -q 'tests/test_tensor\.cpp\( \|$\)' <(ninja -C "$b1" -t commands 2>/dev/null)

# 3. The reverse order: run-default after run.sh keeps the directory's configuration.
before=$(stat -c %Y "$b1/build.ninja")
(cd "$root" && FSDP_BUILD_DIR=$b1 bash jobs/run-default.sh >"$b1.again.out" 2>&1)
rc=$?
check "run-default.sh after run.sh (rc $rc)" test $rc -eq 0
check "run-default.sh leaves run.sh's configuration as it is" test "$(stat -c %Y "$b1/build.ninja")" = "$before"

# 4. Failed steps say what failed. Two small projects: a missing dependency, a compile error.
unset FSDP_CONFIGURE_ONLY
p1=$work/no-dep
mkdir -p "$p1"
printf "project('p', 'cpp')\ndependency('fsdp-no-such-package')\n" >"$p1/meson.build"
out=$(cd "$root" && FSDP_SOURCE_ROOT=$p1 FSDP_BUILD_DIR=$p1/build bash jobs/run-default.sh 2>&1)
rc=$?
check "setup failure: non-zero exit" test $rc -ne 0
check "setup failure: Meson's error line" grep -q 'Dependency "fsdp-no-such-package" not found' <<<"$out"
check "setup failure: what to do next" grep -q '^build.sh: meson setup .* failed; next: ' <<<"$out"
p2=$work/bad-code
mkdir -p "$p2"
printf "project('p', 'cpp')\nexecutable('fsdp_app', 'app.cpp')\nexecutable('fsdp_ckpt', 'app.cpp')\nexecutable('fsdp_bench', 'app.cpp')\nexecutable('sgemm_peak', 'app.cpp')\n" >"$p2/meson.build"
printf 'int main() { return undeclared_name_in_app; }\n' >"$p2/app.cpp"
printf "option('tests', type : 'feature', value : 'auto')\n" >"$p2/meson_options.txt"  # run.sh sets it
out=$(cd "$root" && FSDP_SOURCE_ROOT=$p2 FSDP_BUILD_DIR=$p2/build bash jobs/run-default.sh 2>&1)
rc=$?
check "compile failure: non-zero exit" test $rc -ne 0
check "compile failure: the compiler's error line" grep -q "app.cpp:1:.*error: .*undeclared_name_in_app" <<<"$out"
check "compile failure: what to do next" grep -q '^build.sh: meson compile .* failed; next: ' <<<"$out"
out=$(cd "$root" && FSDP_SOURCE_ROOT=$p2 bash tests/run.sh "$p2/build" 2>&1)
rc=$?
check "tests/run.sh compile failure: error line, next line, 0 passed, 1 failed" bash -c \
  'grep -q "error: .*undeclared_name_in_app" <<<"$1" && grep -q "^build.sh: meson compile" <<<"$1" && [ "$(tail -1 <<<"$1")" = "0 passed, 1 failed" ] && [ $2 -ne 0 ]' _ "$out" "$rc"

total=$((passed + failed))
echo "  $passed test cases out of $total passed"
[ $failed -eq 0 ] || echo "  $failed test cases out of $total failed"
[ $failed -eq 0 ]
