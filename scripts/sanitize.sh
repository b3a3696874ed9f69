#!/usr/bin/env bash
# Sanitizer stages; scripts/test.sh runs them after the suite (so CI does), or alone:
#   scripts/sanitize.sh [asan|tsan|all]          (default all; exit non-zero on any report)
# asan: AddressSanitizer + UBSan build of the test binary and stepbench (CUDA off, -O1 -g1: the
#       cpu-only configuration), the whole CPU gtest suite, the command-line tests whose output
#       depends on the build, and the two-process MPI test with Open MPI's own leaks suppressed
#       (tests/support/lsan.supp; the slow unwinder there, so that a leak is traced into the library).
# tsan: ThreadSanitizer build, the towers, host-collective, input-pipeline and JPEG tests with one
#       OpenMP thread: Debian's libgomp is not instrumented, so TSan cannot see its barriers, and with
#       two threads nearly every report is inside an OpenMP region (measured: 427 reports, none real).
# Build folders: $STEPBENCH_BUILD_DIR-asan and -tsan (default build-asan, build-tsan), unity builds.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
what=${1:-all}
case $what in asan | tsan | all) ;; *)
  echo "usage: scripts/sanitize.sh [asan|tsan|all]" >&2
  exit 2
  ;;
esac
BASE=${STEPBENCH_BUILD_DIR:-$STEPBENCH_ROOT/build}
# unity builds (a target's sources compiled a few at a time as one file): 5.7 instead of 9.1 minutes
# for the ASan build on two cores; names in a file's anonymous namespace must then be unique in its
# target (the build says which clash)
flags=(-DSTEPBENCH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
  -DCMAKE_UNITY_BUILD=ON)

build_tests() {  # dir, cmake args...
  local dir=$1; shift
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$STEPBENCH_ROOT" -B "$dir" "${gen[@]}" "${flags[@]}" "$@" >/dev/null
  cmake --build "$dir" --parallel "$(nproc)" --target stepbench_tests
}

rc=0
if [ "$what" != tsan ]; then
  echo "== asan: AddressSanitizer + UBSan"
  build_tests "$BASE-asan" -DSTEPBENCH_SANITIZE=ON -DSTEPBENCH_TSAN=OFF
  built_cli=1
  cmake --build "$BASE-asan" --parallel "$(nproc)" --target stepbench || { rc=1; built_cli=0; }
  # the fast (frame-pointer) unwinder records each allocation's stack: with the slow one (DWARF) the
  # suite took 5.6 minutes here instead of 3.1. Only the MPI step needs the slow one, to reach a frame
  # in Open MPI (built without frame pointers) that tests/support/lsan.supp names.
  export ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export LSAN_OPTIONS=suppressions=$STEPBENCH_ROOT/tests/support/lsan.supp
  # every test but the two largest Inception-unit sweeps (65 s of the 2 minutes here) and the two
  # ResNet-50 ones (the same kernels, slices and views run in the aux-head units, the graph's
  # residual net and the op tests), half the real models' liveness cases (one layout of each), and
  # the fused units' whole-model steps (their pieces run in the op tests, the small nets and
  # Liveness.FusedUnits...), and the zoo's initialisation (VGG-16's 138M draws: the generator)
  OMP_NUM_THREADS=2 "$BASE-asan/bin/stepbench_tests" --gtest_brief=1 \
    --gtest_filter='-Layouts/InceptionUnits.EveryUnitMatchesTheOracleInPlace/*:Layouts/ResNet50Units.*:*LivenessOfRealModels.*/inception_v3_nchw*:*LivenessOfRealModels.*/resnet50_nhwc*:*LivenessOfRealModels.*/alexnet_nchw*:*LivenessOfRealModels.*/densenet121_nhwc*:*LivenessOfRealModels.*/mobilenet_v2_nchw*:FusedModels/*:*FuseSteps.*:Zoo.Initialisation*' || rc=1
  # two processes under mpirun: the towers test over MPI (STEPBENCH_TEST_RANKS: it fails, not skips,
  # when the two do not find each other), and each process must have run some of it
  if command -v mpirun >/dev/null && grep -q 'STEPBENCH_MPI:BOOL=ON' "$BASE-asan/CMakeCache.txt"; then
    log=$BASE-asan/mpi.log
    if ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0 STEPBENCH_TEST_RANKS=2 OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 mpirun --oversubscribe -np 2 \
      "$BASE-asan/bin/stepbench_tests" --gtest_filter='Dist.*' --gtest_brief=1 --gtest_color=no >"$log" 2>&1 &&
      [ "$(grep -cE '^\[  PASSED  \] [1-9]' "$log")" = 2 ]; then
      echo "mpi, 2 processes: $(grep -m1 '^\[  PASSED  \]' "$log") in each"
    else
      echo "mpi, 2 processes: FAILED (or nothing ran)"
      tail -n 40 "$log"
      rc=1
    fi
  fi
  # the binary as a user without the CUDA toolkit builds it (the cpu-only preset: CUDA off), under
  # ASan: the command-line tests whose output depends on the build (flags, presets, JSON, the
  # summary, compare; about 30 s) and --help against its snapshot
  if [ "$built_cli" = 1 ] && command -v python3 >/dev/null; then
    log=$BASE-asan/cli.log
    for part in Flags Presets Json Output Compare; do
      if python3 "$STEPBENCH_ROOT/tests/cli/test_cli.py" --stepbench "$BASE-asan/bin/stepbench" \
        --configs "$STEPBENCH_ROOT/configs" "$part" >"$log" 2>&1; then
        echo "cpu-only cli.$part: $(grep -m1 '^Ran ' "$log")"
      else
        echo "cpu-only cli.$part: FAILED"
        tail -n 40 "$log"
        rc=1
      fi
    done
  fi
  if [ "$built_cli" = 1 ]; then
    "$STEPBENCH_ROOT/tests/cli/help_snapshot.sh" "$BASE-asan/bin/stepbench" "$STEPBENCH_ROOT/tests/cli/help.txt" || rc=1
  fi
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
fi
if [ "$what" != asan ]; then
  echo "== tsan: ThreadSanitizer, one OpenMP thread"
  build_tests "$BASE-tsan" -DSTEPBENCH_TSAN=ON -DSTEPBENCH_SANITIZE=OFF
  # one OpenMP thread, so one shard per core (gtest's sharding), side by side: 153 s as one process
  # on two cores
  shards=$(nproc)
  [ "$shards" -le 8 ] || shards=8
  pids=()
  for ((i = 0; i < shards; i++)); do
    OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 GTEST_TOTAL_SHARDS=$shards \
      GTEST_SHARD_INDEX=$i "$BASE-tsan/bin/stepbench_tests" --gtest_brief=1 --gtest_color=no \
      --gtest_filter='Towers.*:HostCollective.*:Data.*:JpegMutation.*:Png.*:Records.*:Health.*:PlanCache.*' \
      >"$BASE-tsan/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < shards; i++)); do
    if wait "${pids[$i]}"; then
      echo "tsan shard $((i + 1)) of $shards: $(grep -m1 '^\[  PASSED  \]' "$BASE-tsan/shard$i.log")"
    else
      echo "tsan shard $((i + 1)) of $shards: FAILED"
      cat "$BASE-tsan/shard$i.log"
      rc=1
    fi
  done
fi
echo "== sanitizers: $([ $rc -eq 0 ] && echo clean || echo FAILED)"
exit $rc
