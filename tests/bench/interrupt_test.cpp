// Interrupt::fail against the real Google Benchmark: a sync that fails before a repetition's loop has
// begun (the agreement's collective at the benchmark's start, when a peer's host died between two
// repetitions) must leave that repetition counting the iterations the others ran, or Google
// Benchmark 1.7's statistics over the repetitions abort the run (statistics.cc: `run_iterations ==
// run.iterations`), as hosts.cluster's killed host once did. Planted (2026-12-02): fail() without
// beginning the loop aborts this test's process.
#include <benchmark/benchmark.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/interrupt.hpp"
#include "comm/process_group.hpp"

namespace stepbench {
namespace {

class Keep : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override { all.insert(all.end(), runs.begin(), runs.end()); }
  std::vector<Run> all;
};

TEST(Interrupt, ASyncFailingBeforeTheLoopKeepsTheRepetitionsCountsAlike) {
  const ProcessGroup alone;
  const Interrupt stop(nullptr, alone);
  int calls = 0;
  benchmark::RegisterBenchmark("interrupt_test/fails_between_repetitions",
                               [&](benchmark::State& st) {
                                 if (stop.skip(st)) return;
                                 if (++calls == 3) {  // as a SyncError from agreed() would come
                                   stop.fail(st, "rank 1 (pid 7 on h) did not answer");
                                   return;
                                 }
                                 for (auto _ : st) st.SetIterationTime(1e-3);
                               })
      ->UseManualTime()
      ->Iterations(5)
      ->Repetitions(4);  // two measured before the failure: the statistics are computed
  Keep keep;
  benchmark::RunSpecifiedBenchmarks(&keep, "interrupt_test/.*");
  benchmark::ClearRegisteredBenchmarks();
  std::vector<benchmark::BenchmarkReporter::Run> reps;
  for (const auto& r : keep.all)
    if (r.run_type == benchmark::BenchmarkReporter::Run::RT_Iteration) reps.push_back(r);
  ASSERT_EQ(reps.size(), 4u);
  EXPECT_FALSE(reps[0].error_occurred);
  EXPECT_FALSE(reps[1].error_occurred);
  EXPECT_TRUE(reps[2].error_occurred);
  EXPECT_EQ(reps[2].error_message, "the sync failed: rank 1 (pid 7 on h) did not answer");
  EXPECT_TRUE(reps[3].error_occurred);  // the group is spent: marked, not run
  EXPECT_EQ(reps[3].error_message, "not run: rank 1 (pid 7 on h) did not answer");
  for (const auto& r : reps) EXPECT_EQ(r.iterations, 5);
  EXPECT_TRUE(stop.spent());
  EXPECT_EQ(calls, 3);
}

}  // namespace
}  // namespace stepbench
