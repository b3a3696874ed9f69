#!/usr/bin/env bash
# Shows that the towers, sync, optimizer, gate, straggler, memory plan and recompute, input
# pipeline and JSON counter tests have teeth: plants one plausible bug at a time as a one-line edit
# (sed) in a copy of the sources, rebuilds there and runs the tests that must catch it; each must
# fail. The faults come from reads of the tests for ones they missed (2026-11-29); most were tried
# against the tests as they were, and passed them. plant_faults.sh does the same for the oracle and
# parity tests with compile-time faults in the convolution. Not part of ctest (a build, then an
# incremental one per fault: about 5 + 1 to 2 minutes each on 2 cores). Run by hand after changing
# a test's tolerance or one of these files:
#   tests/mutation/edit_faults.sh [WORK]          (default /tmp/stepbench-edit-faults)
#   FAULTS="sum_not_mean one_step" tests/mutation/edit_faults.sh     some of them
#   CHECK_EDITS=1 tests/mutation/edit_faults.sh    only that every edit still applies (no build)
# Prints one line per fault; exits 1 if a fault was not caught or its edit no longer applies.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${1:-/tmp/stepbench-edit-faults}
SRC=$WORK/src
BUILD=$WORK/build

# name | file | sed expression (must change the file) | gtest filter, or test_cli.py's class | how:
# 0 one process, 2 `stepbench launch --nproc 2`, 4 --nproc 4 --nodes 2, cli tests/cli/test_cli.py
FAULTS_TABLE=$(cat <<'EOF'
sum_not_mean|src/comm/host_collective.cpp|43s/local_ \* procs_)/local_ * procs_ - 1)/|Towers.NTowersEndWhereTheOracleStepsEnd|0
drop_last_tower|src/comm/host_collective.cpp|s/i = 1; i < bufs.size(); ++i) be_.add/i = 1; i + 1 < bufs.size(); ++i) be_.add/|Towers.NTowersEndWhereTheOracleStepsEnd|0
no_momentum|src/backend/cpu/optimizer.cpp|s/s0\[i\] = mu \* s0\[i\] + g;/s0[i] = g;/|Towers.NTowersEndWhereTheOracleStepsEnd|0
one_step|tests/train/towers_test.cpp|s/^      for (int k = 0; k < 2; ++k) t.step();/      for (int k = 0; k < 1; ++k) t.step();/|Towers.NTowersEndWhereTheOracleStepsEnd|0
rms_starts_at_0|src/train/trainer.cpp|s/cfg.kind == OptimizerKind::rmsprop ? 1.0f : 0.0f/0.0f/|OptimizerState.*|0
state_unfilled|src/train/trainer.cpp|s/    be.fill(s, p0_/    if (in.empty()) be.fill(s, p0_/|OptimizerState.*|0
only_tower0_updates|src/train/sync_independent.cpp|s/void update() override { t_.update_every_tower(); }/void update() override { t_.towers[0]->tr->update(t_.towers[0]->compute()); }/|Towers.IndependentTowers*|0
push_not_scaled|src/train/sync_async.cpp|s/    be.scale(be.default_stream(), sum, 1.0f \/ static_cast<float>(each), n);/    (void)each;/|Dist.Async*|2
push_scaled_by_towers_only|src/train/sync_async.cpp|s/const std::size_t each = t_.towers.size() \* static_cast<std::size_t>(in_ ? in_->size() : 1);/const std::size_t each = t_.towers.size();/|Dist.Async*|4
interval_in_logs|src/compare/stats.cpp|s/iv.lo = std::exp(percentile(meds, a));/iv.lo = percentile(meds, a);/|CompareGate.InterleavedRounds*|0
interval_at_alpha|src/compare/evidence.cpp|s/bootstrap_paired_median(d, 1 - alpha)/bootstrap_paired_median(d, alpha)/|CompareGate.InterleavedRounds*|0
history_not_cut|src/compare/evidence.cpp|75,77s/if (!cps.empty()) x.erase/if (false) x.erase/|CompareFiles.AHistory*|0
wait_with_compute|src/bench/straggler.cpp|s/step\[t\].released_ms - step\[t\].begin_ms - step\[t\].compute()/step[t].released_ms - step[t].begin_ms/|Straggler.*|0
wait_from_zero|src/bench/straggler.cpp|s/step\[t\].released_ms - step\[t\].begin_ms - step\[t\].compute()/step[t].released_ms - step[t].compute()/|Straggler.*|0
individual_inverted|src/bench/straggler.cpp|s/s.individual = s.median_ms > 0 ? s.best_ms \/ s.median_ms : 1;/s.individual = s.best_ms > 0 ? s.median_ms \/ s.best_ms : 1;/|Straggler.*|0
reference_fastest|src/bench/straggler.cpp|s/const int ref = others\[(others.size() - 1) \/ 2\].second;/const int ref = others.front().second;/|Straggler.*|0
first_fit|src/graph/assign.cpp|s/gap < best_gap))/gap < best_gap \&\& best_gap == 0))/|MemoryPlan.*|0
no_reuse|src/graph/assign.cpp|s/    b.offset = found ? best : at;/    b.offset = found \&\& best > at ? best : at;/|MemoryPlan.*|0
remade_per_reader|src/graph/liveness.cpp|s/remade_.count(b)/false/|Liveness.RecomputedOutputsGiveTheSameStepBitForBit|0
label_by_place|src/data/pipeline.cpp|273s/labels_\[item\]/labels_[k % n]/|Data.EveryImageArrivesWithItsOwnLabel|0
crop_column_from_y|src/data/augment.cpp|s/static_cast<std::size_t>(b.x + x0) \* 3;/static_cast<std::size_t>(b.y + x0) * 3;/|Data.CropAndFlip*|0
nchw_not_flipped|src/data/augment.cpp|s/for (int x = 0; x < S; ++x) d\[flip ? S - 1 - x : x\]/for (int x = 0; x < S; ++x) d[x]/|Data.CropAndFlip*|0
busbw_without_factor|src/bench/run_parts.cpp|s/rate(gb \* towers.bus_factor())/rate(gb)/|Json|cli
params_of_one_tower|src/bench/run_parts.cpp|s/num_parameters()) \* towers.size())/num_parameters()))/|Json|cli
step_tflops_2x|src/bench/run_parts.cpp|s/rate(images \* 3.0 \* fl.train_forward \/ 1e12)/rate(images * 2.0 * fl.train_forward \/ 1e12)/|Json|cli
images_of_one_tower|src/bench/summary.cpp|s/(t.asynchronous() ? t.size() : gpus))/(t.asynchronous() ? t.size() : 1))/|Output|cli
saved_in_inference|src/graph/memory_plan.cpp|s/here.phase == MemoryPhase::forward_only;/here.phase == MemoryPhase::training_forward;/|Json|cli
EOF
)

mkdir -p "$WORK"
# the working tree's files (tracked, and untracked but not ignored), as they are now, stamped now
# (-m): a build left by an earlier run, with its last fault compiled in, is then rebuilt whole
rm -rf "$SRC" && mkdir -p "$SRC"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard | tar -C "$ROOT" --null -T - -cf - | tar -C "$SRC" -xmf -
if [ -z "${CHECK_EDITS:-}" ] && [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPBENCH_CUDA=OFF -DSTEPBENCH_MPI=OFF \
    > "$WORK/configure.log" 2>&1 || { echo "configure failed (see $WORK/configure.log)"; exit 1; }
fi
status=0
while IFS='|' read -r name file expr filter ranks; do
  [ -z "$name" ] && continue
  if [ -n "${FAULTS:-}" ] && [[ " $FAULTS " != *" $name "* ]]; then continue; fi
  cp "$ROOT/$file" "$SRC/$file"
  sed -i "$expr" "$SRC/$file"
  if cmp -s "$ROOT/$file" "$SRC/$file"; then
    echo "$name: the edit no longer applies to $file (update this table)"
    status=1
    continue
  fi
  log=$WORK/$name.log
  if [ -n "${CHECK_EDITS:-}" ]; then
    echo "$name: the edit applies to $file"
  elif ! cmake --build "$BUILD" --target stepbench_tests stepbench > "$log" 2>&1; then
    echo "$name: build failed (see $log)"
    status=1
  else
    case $ranks in
      0) cmd=("$BUILD/bin/stepbench_tests" --gtest_filter="$filter" --gtest_brief=1) ;;
      2) cmd=("$BUILD/bin/stepbench" launch --nproc 2 -- "$BUILD/bin/stepbench_tests" --gtest_filter="$filter") ;;
      4) cmd=("$BUILD/bin/stepbench" launch --nproc 4 --nodes 2 -- "$BUILD/bin/stepbench_tests"
              --gtest_filter="$filter") ;;
      cli) cmd=(python3 "$SRC/tests/cli/test_cli.py" --stepbench "$BUILD/bin/stepbench" --configs "$SRC/configs"
                "$filter") ;;
      *) cmd=(false) ; echo "$name: unknown way of running '$ranks' (0, 2, 4 or cli)" >> "$log" ;;
    esac
    timeout 600 "${cmd[@]}" >> "$log" 2>&1 < /dev/null
    rc=$?
    # caught only by a failed check: a timeout, a launch that failed or tests that all skipped are not
    if [ $rc -eq 0 ]; then
      echo "$name ($file): $filter PASSED -- not caught"
      status=1
    elif grep -qE '^\[  FAILED  \]|^FAILED \(.*failures=' "$log"; then
      echo "$name ($file): $filter failed: caught ($(grep -c -E 'Failure|AssertionError' "$log") failed checks)"
    else
      echo "$name ($file): $filter ended with $rc but no test failed: not a catch (see $log)"
      status=1
    fi
  fi
  cp "$ROOT/$file" "$SRC/$file"
done <<< "$FAULTS_TABLE"
exit $status
