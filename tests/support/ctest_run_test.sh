#!/usr/bin/env bash
# ctest_run.sh itself: a failing command fails the entry even with the expected output, missing
# output fails it, a GoogleTest run that skipped everything is 77, a bad option is a usage error.
set -u
run=$(dirname "${BASH_SOURCE[0]}")/ctest_run.sh
bad=0
check() {  # want, args...
  local want=$1; shift
  "$run" "$@" > /dev/null 2>&1
  local rc=$?
  if [[ $rc -ne $want ]]; then echo "ctest_run.sh $*: exit $rc, want $want"; bad=1; fi
}
check 1 --expect foo -- sh -c 'echo foo; exit 1'
check 1 --expect bar -- sh -c 'echo foo'
check 0 --expect foo -- sh -c 'echo foo'
check 77 --skip-if-none-ran -- sh -c 'echo "[  PASSED  ] 0 tests."'
check 0 --skip-if-none-ran -- sh -c 'echo "[  PASSED  ] 3 tests."'
check 1 --skip-if-none-ran -- sh -c 'echo "[  PASSED  ] 0 tests."; exit 1'
check 1 --skip-if-none-ran -- sh -c 'echo "[==========] Running 0 tests from 0 test suites."; echo "[  PASSED  ] 0 tests."'
check 2 --bogus -- true
[[ $bad -eq 0 ]] && echo "ctest_run.sh: all cases as expected"
exit $bad
