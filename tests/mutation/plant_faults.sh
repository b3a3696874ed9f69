#!/usr/bin/env bash
# Shows that the oracle, graph and parity tests have teeth: builds the cpu backend once per planted
# fault (cmake -DSTEPBENCH_PLANT_FAULT=n, CUDA and MPI off, in WORK/fault-n) and runs the tests that
# judge numerics; each must fail on each fault. Faults 1-4 are in the convolution (the op, unit,
# whole-net and parity tests judge them), 5-7 in the fused units' pieces (GraphConfig::fuse: the
# fused op tests, the whole fused step against the unfused one and the fused small nets against the
# oracle judge them). Prints one line per fault and test. Not part of ctest (a build per fault); run
# by hand after changing a tolerance, the error model or the fused pieces:
#   tests/mutation/plant_faults.sh [WORK]          (default /tmp/stepbench-faults)
#   FAULTS="5 6 7" tests/mutation/plant_faults.sh  some of them
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${1:-/tmp/stepbench-faults}
PY=${STEPBENCH_PARITY_PYTHON:-/usr/bin/python3}
names=("" "filter gradient doubled" "filter gradient zero" "filter transposed (kh <-> kw)" "padding shifted one pixel"
  "fused load drops the ReLU" "fused load ignores the BN scale" "statistics-only variance short of one pixel")
conv_tests=('*Ops.Convolution/cpu*' '*GraphTest.UnitGradients*cpu*' '*GraphTest.LossAndGradients*cpu*'
  'Graph.LayoutsAgree' '*InceptionUnits*')
fused_tests=('*Ops.FusedUnitPieces/cpu*' '*Ops.FusedBnAddRelu/cpu*' '*FuseSteps*' '*GraphTest.FusedUnits*cpu*')
status=0
mkdir -p "$WORK"
for n in ${FAULTS:-1 2 3 4 5 6 7}; do
  dir=$WORK/fault-$n
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPBENCH_CUDA=OFF -DSTEPBENCH_MPI=OFF \
    -DSTEPBENCH_PLANT_FAULT=$n > "$dir.log" 2>&1 && cmake --build "$dir" --parallel "$(nproc)" >> "$dir.log" 2>&1 ||
    { echo "fault $n: build failed (see $dir.log)"; status=1; continue; }
  tests=("${conv_tests[@]}")
  [ "$n" -ge 5 ] && tests=("${fused_tests[@]}")
  # the residual adds' units have no ReLU to drop: their test cannot see fault 5
  [ "$n" = 5 ] && tests=("${fused_tests[0]}" "${fused_tests[@]:2}")
  for t in "${tests[@]}"; do
    if "$dir/bin/stepbench_tests" --gtest_filter="$t" --gtest_brief=1 > "$dir/test.log" 2>&1; then
      echo "fault $n (${names[$n]}): $t PASSED -- not caught"; status=1
    else
      echo "fault $n (${names[$n]}): $t failed: caught ($(grep -c 'Failure' "$dir/test.log") failed checks)"
    fi
  done
  [ "$n" -ge 5 ] && continue  # parity runs the unfused step
  if "$PY" "$ROOT/tests/parity/torch_parity.py" --stepbench "$dir/bin/stepbench" --formats nchw > "$dir/parity.log" 2>&1; then
    echo "fault $n (${names[$n]}): parity.inception_v3 PASSED -- not caught"; status=1
  else
    echo "fault $n (${names[$n]}): parity.inception_v3 failed: caught ($(sed -n '/MISMATCH/,$p' "$dir/parity.log" | grep -c '^  ') mismatches)"
  fi
done
exit $status
