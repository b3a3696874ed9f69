#!/usr/bin/env bash
# stepbench --help against its committed snapshot (tests/cli/help.txt): a flag added, removed or
# re-worded shows here as a diff, so the help is read before it changes. Refresh it after a change
# that is meant:
#   build/bin/stepbench --help > tests/cli/help.txt
# Also: no line over 100 columns, every flag in one of the groups (none under "Other:").
#   help_snapshot.sh STEPBENCH EXPECTED
set -uo pipefail
bin=$1 expected=$2
actual=$("$bin" --help) || { echo "help_snapshot: $bin --help failed" >&2; exit 1; }
fail=0
if ! diff -u "$expected" <(printf '%s\n' "$actual"); then
  echo "help_snapshot: stepbench --help differs from $expected (above); if that is meant, refresh it:" >&2
  echo "  build/bin/stepbench --help > tests/cli/help.txt" >&2
  fail=1
fi
if wide=$(printf '%s\n' "$actual" | awk 'length($0) > 100') && [ -n "$wide" ]; then
  echo "help_snapshot: lines over 100 columns:" >&2
  printf '%s\n' "$wide" >&2
  fail=1
fi
if printf '%s\n' "$actual" | grep -q '^Other:'; then
  echo "help_snapshot: flags without a group (add them to kFlags in src/cli/help.cpp):" >&2
  printf '%s\n' "$actual" | sed -n '/^Other:/,/^$/p' >&2
  fail=1
fi
exit $fail
