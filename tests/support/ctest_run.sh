#!/usr/bin/env bash
# Runs a test command for ctest so that its entry can fail and never passes without running:
#   ctest_run.sh [--expect REGEX] [--skip-if-none-ran] -- COMMAND [ARGS...]
# The command's exit status counts (a non-zero status fails the entry even when the expected
# output is there); --expect: its output must also match REGEX (grep -E); --skip-if-none-ran:
# a GoogleTest run in which no test passed (every one skipped, e.g. no GPU) exits 77, which the
# entry's SKIP_RETURN_CODE turns into "skipped" instead of "passed". A GoogleTest filter that
# matches no test at all (a renamed test) fails.
set -uo pipefail
expect="" skip_none=0
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    --expect) expect=$2; shift 2 ;;
    --skip-if-none-ran) skip_none=1; shift ;;
    *) echo "ctest_run.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ ${1:-} == -- ]] || { echo "ctest_run.sh: missing -- COMMAND" >&2; exit 2; }
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
if [[ $rc -ne 0 ]]; then
  echo "ctest_run.sh: the command exited $rc" >&2
  exit 1
fi
if [[ -n $expect ]] && ! grep -Eq "$expect" "$out"; then
  echo "ctest_run.sh: no output line matches: $expect" >&2
  exit 1
fi
if grep -Eq '^\[==========\] Running 0 tests' "$out"; then
  echo "ctest_run.sh: the filter matches no test" >&2
  exit 1
fi
if [[ $skip_none -eq 1 ]] && grep -Eq '^\[  PASSED  \] 0 tests' "$out"; then
  echo "ctest_run.sh: every test was skipped" >&2
  exit 77
fi
exit 0
