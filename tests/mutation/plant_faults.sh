#!/usr/bin/env bash
# Shows that the oracle, graph and parity tests have teeth: builds the cpu backend once per planted
# fault (cmake -DSTEPBENCH_PLANT_FAULT=n, CUDA and MPI off, in WORK/fault-n) and runs the tests that
# judge numerics; each must fail on each fault. Prints one line per fault and test. Not part of
# ctest (four builds); run by hand after changing a tolerance or the error model:
#   tests/mutation/plant_faults.sh [WORK]          (default /tmp/stepbench-faults)
#   FAULTS="3 4" tests/mutation/plant_faults.sh    some of them
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${1:-/tmp/stepbench-faults}
PY=${STEPBENCH_PARITY_PYTHON:-/usr/bin/python3}
names=("" "filter gradient doubled" "filter gradient zero" "filter transposed (kh <-> kw)" "padding shifted one pixel")
status=0
mkdir -p "$WORK"
for n in ${FAULTS:-1 2 3 4}; do
  dir=$WORK/fault-$n
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPBENCH_CUDA=OFF -DSTEPBENCH_MPI=OFF \
    -DSTEPBENCH_PLANT_FAULT=$n > "$dir.log" 2>&1 && cmake --build "$dir" --parallel "$(nproc)" >> "$dir.log" 2>&1 ||
    { echo "fault $n: build failed (see $dir.log)"; status=1; continue; }
  for t in '*Ops.Convolution/cpu*' '*GraphTest.UnitGradients*cpu*' '*GraphTest.LossAndGradients*cpu*' \
    'Graph.LayoutsAgree' '*InceptionUnits*'; do
    if "$dir/bin/stepbench_tests" --gtest_filter="$t" --gtest_brief=1 > "$dir/test.log" 2>&1; then
      echo "fault $n (${names[$n]}): $t PASSED -- not caught"; status=1
    else
      echo "fault $n (${names[$n]}): $t failed: caught ($(grep -c 'Failure' "$dir/test.log") failed checks)"
    fi
  done
  if "$PY" "$ROOT/tests/parity/torch_parity.py" --stepbench "$dir/bin/stepbench" --formats nchw > "$dir/parity.log" 2>&1; then
    echo "fault $n (${names[$n]}): parity.inception_v3 PASSED -- not caught"; status=1
  else
    echo "fault $n (${names[$n]}): parity.inception_v3 failed: caught ($(sed -n '/MISMATCH/,$p' "$dir/parity.log" | grep -c '^  ') mismatches)"
  fi
done
exit $status
