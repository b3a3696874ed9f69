#!/usr/bin/env bash
# The library as another project meets it (ctest install.consumer):
#   1. installs this build into a temporary prefix (cmake --install);
#   2. configures, builds and runs tests/install/consumer against it with find_package(stepbench):
#      build the tiny model, plan it, time a step on the cpu backend, read a run file that the
#      stepbench binary wrote;
#   3. configures tests/install/parent, which takes the source tree with add_subdirectory and checks
#      that nothing is imposed on it (build type, definitions, options, tests, the binary).
#   test_install.sh BUILD_DIR SOURCE_DIR STEPBENCH_BINARY
set -euo pipefail
build=$1 src=$2 bin=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

echo "== install into $tmp/prefix"
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
ls "$tmp/prefix/include/stepbench" "$tmp/prefix/lib/cmake/stepbench"
[ ! -e "$tmp/prefix/include/graph" ] || { echo "internal headers were installed" >&2; exit 1; }

echo "== a run file from the binary"
"$bin" --backend cpu --model tiny --image-size 32 --batch-size 2 --warmup 1 --repetitions 2 --phases forward,step \
  --benchmark_min_time=0.01 --json "$tmp/run.json" >/dev/null

echo "== the consumer, against the installed package"
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" "${gen[@]}" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/consumer-configure.log" \
  || { cat "$tmp/consumer-configure.log"; exit 1; }
cmake --build "$tmp/consumer" >"$tmp/consumer-build.log" || { cat "$tmp/consumer-build.log"; exit 1; }
"$tmp/consumer/consumer" "$tmp/run.json"

echo "== a parent project with add_subdirectory (configure only)"
cmake -S "$src/tests/install/parent" -B "$tmp/parent" "${gen[@]}" -DSTEPBENCH_SOURCE_DIR="$src" \
  -DSTEPBENCH_CUDA=OFF >"$tmp/parent.log" || { cat "$tmp/parent.log"; exit 1; }
grep "parent:" "$tmp/parent.log"
tests=$(cd "$tmp/parent" && ctest -N | sed -n 's/^Total Tests: //p')
[ "${tests:-0}" = 0 ] || { echo "the parent got $tests of stepbench's tests" >&2; exit 1; }
echo "install.consumer: ok"
