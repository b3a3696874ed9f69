#!/usr/bin/env bash
# The habits CI keeps (scripts/test.sh runs this after the build):
#   - layers: no include with "..", which would get around the per-layer include roots
#     (cmake/StepbenchLayer.cmake); no file in src/ over 450 lines; no getenv/exit in the library;
#   - unity builds: no name defined in the anonymous namespaces of two files of one target
#     (scripts/unity-names.py);
#   - format: clang-format --dry-run --Werror over src/ and tests/ (.clang-format);
#   - clang-tidy over every C++ file of src/ with the build's compile_commands.json (.clang-tidy),
#     no findings allowed; eight files of one target per run (scripts/tidy-unity.py).
#   scripts/lint.sh BUILD_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: scripts/lint.sh BUILD_DIR (a configured build with compile_commands.json)}
[ -f "$BUILD/compile_commands.json" ] || { echo "lint: $BUILD/compile_commands.json missing; build first" >&2; exit 2; }
cd "$ROOT"
fail=0

if grep -rnE '#include "[^"]*\.\./' src tests include --include='*.cpp' --include='*.hpp' --include='*.cu'; then
  echo "lint: includes with '..' (include by the path below src/, e.g. \"graph/graph.hpp\")" >&2
  fail=1
fi
while read -r n f; do
  [ "$f" = total ] && continue
  if [ "$n" -gt 450 ]; then echo "lint: $f has $n lines (at most about 400: split it by what it does)" >&2; fail=1; fi
done < <(find src -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' | xargs wc -l)
# the library reads no environment variables and never exits: the command line does (src/cli/main.cpp)
if grep -rnE '\b(getenv|exit|_Exit|quick_exit)\s*\(' src --include='*.cpp' --include='*.hpp' --include='*.cu' \
   | grep -v '^src/cli/'; then
  echo "lint: environment reads or exit() in the library; read it in src/cli and pass it down" >&2
  fail=1
fi
# a name in two files' anonymous namespaces of one target breaks the unity builds (the default)
if ! python3 scripts/unity-names.py .; then
  echo "lint: names defined twice in one target's anonymous namespaces (above)" >&2
  fail=1
fi

mapfile -t fmt_files < <(find src tests include -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' | sort)
if ! clang-format --dry-run --Werror "${fmt_files[@]}"; then
  echo "lint: not formatted; run: clang-format -i \$(find src tests -name '*.cpp' -o -name '*.hpp' -o -name '*.cu')" >&2
  fail=1
fi

# a few files of one target per clang-tidy run, as in a unity build (scripts/tidy-unity.py)
if ! python3 scripts/tidy-unity.py "$BUILD"; then
  echo "lint: clang-tidy findings above (.clang-tidy lists the checks)" >&2
  fail=1
fi
[ $fail -eq 0 ] && echo "lint: ok (layers, unity names, format, clang-tidy)"
exit $fail
