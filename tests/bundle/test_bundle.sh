#!/usr/bin/env bash
# ctest bundle.self_contained: makes the GPU bundle (scripts/gpu-bundle.sh) from BUILD_DIR's binaries
# without MPI (--from-build: the build the tests run from, seconds instead of a second build of 9
# minutes beside the tests), or in a build folder of its own where no BUILD_DIR is given; checks that
# it is self-contained and small enough to carry, that ldd resolves every library not on the
# allow-list inside the bundle's lib/, runs its binaries on the cpu backend, and checks that its
# gpu-check.sh refuses clearly (exit 2) on a machine without a GPU.
#   tests/bundle/test_bundle.sh SOURCE_DIR WORK_DIR [BUILD_DIR]
set -uo pipefail
SRC=$1
WORK=$2
BUILD=${3:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$WORK"

if [ -n "$BUILD" ]; then from=(--from-build "$BUILD"); else from=(--build-dir "$WORK/build"); fi
"$SRC/scripts/gpu-bundle.sh" "$WORK/bundle" "${from[@]}" > "$WORK/bundle.log" 2>&1 ||
  { tail -20 "$WORK/bundle.log"; fail "gpu-bundle.sh failed"; }
"$SRC/scripts/gpu-bundle.sh" --check "$WORK/bundle" || fail "the bundle is not self-contained"
B=$WORK/bundle

# every library not on the allow-list resolves inside the bundle, whatever the system has
missing=$(for f in "$B"/bin/*; do ldd "$f"; done | awk '$2 == "=>" {print $1, $3}' |
  grep -Ev '^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudnn[a-z_]*|libcublas|libcublasLt|libnccl)\.' |
  grep -v " $B/" || true)
[ -z "$missing" ] || fail "resolved outside the bundle: $missing"

"$B/bin/stepbench" --version | grep -q '^cuda backend: on' || fail "the bundle's stepbench has no cuda backend"
"$B/bin/stepbench" --backend cpu --model tiny --image-size 32 --batch-size 2 --warmup 1 --repetitions 1 \
  --phases step --benchmark_min_time=0.01 > "$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; fail "stepbench on cpu"; }
grep -q "images/s" "$WORK/run.log" || fail "no summary from the bundle's stepbench"
"$B/bin/stepbench_tests" --gtest_filter='AllBackends/Ops.*cpu*' --gtest_brief=1 > "$WORK/tests.log" 2>&1 ||
  { tail -20 "$WORK/tests.log"; fail "the bundle's tests on cpu"; }
grep -q "PASSED" "$WORK/tests.log" || fail "the bundle's tests ran nothing"

if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "a GPU is visible: gpu-check.sh's refusal without one is not checked here"
else
  "$B/gpu-check.sh" tests "$WORK/check-out" > "$WORK/check.log" 2>&1
  rc=$?
  [ $rc -eq 2 ] || { cat "$WORK/check.log"; fail "gpu-check.sh without a GPU exited $rc, not 2"; }
  grep -q "no NVIDIA GPU visible" "$WORK/check.log" || fail "gpu-check.sh did not say why"
  "$B/gpu-check.sh" nonsense "$WORK/check-out" > /dev/null 2>&1
  [ $? -eq 2 ] || fail "gpu-check.sh with an unknown stage did not exit 2"
fi
echo "bundle: $(du -sm "$B" | cut -f1) MiB, self-contained; binaries run on cpu; gpu-check refuses without a GPU"
