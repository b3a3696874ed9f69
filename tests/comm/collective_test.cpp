// The host collective on its own: every tower holds distinct values, so a reduction that drops,
// repeats or misorders a tower, or touches floats outside its range, shows.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backend/registry.hpp"
#include "comm/collective.hpp"
#include "comm/process_group.hpp"

namespace stepbench {
namespace {

// Tower t's float i: small integers, distinct per tower and per element, so sums are exact in fp32.
float value(int t, std::size_t i) { return static_cast<float>(static_cast<int>(i % 97) * 8 + t * 1000 - 3000); }

TEST(HostCollective, AveragesReducesAndBroadcastsDistinctValuesInTheirRangeOnly) {
  auto be = make_cpu_backend();
  const ProcessGroup self;
  const std::size_t n = 1000, off = 100, count = 700;
  for (int towers : {2, 3, 4}) {
    SCOPED_TRACE(testing::Message() << towers << " towers");
    auto coll = make_host_collective(*be, towers, self);
    EXPECT_FALSE(coll->asynchronous());
    std::vector<std::vector<float>> mem(static_cast<std::size_t>(towers), std::vector<float>(n));
    std::vector<float*> bufs;
    auto reset = [&] {
      for (int t = 0; t < towers; ++t)
        for (std::size_t i = 0; i < n; ++i) mem[static_cast<std::size_t>(t)][i] = value(t, i);
    };
    for (auto& m : mem) bufs.push_back(m.data());
    // the average of the towers' values, rounded once by the division (exact for 2 and 4 towers)
    auto mean = [&](std::size_t i) {
      double s = 0;
      for (int t = 0; t < towers; ++t) s += value(t, i);
      return s / towers;
    };
    auto expect = [&](int t, std::size_t i, double want, const char* what) {
      const double got = mem[static_cast<std::size_t>(t)][i];
      EXPECT_LE(std::abs(got - want), 0x1p-24 * std::abs(want)) << what << ": tower " << t << " float " << i;
    };
    reset();
    coll->allreduce_average(bufs, off, count);
    be->synchronize(be->default_stream());
    for (int t = 0; t < towers; ++t)
      for (std::size_t i = 0; i < n; ++i)
        expect(t, i, i >= off && i < off + count ? mean(i) : value(t, i), "allreduce");
    reset();
    coll->reduce_average(bufs, off, count);
    be->synchronize(be->default_stream());
    for (std::size_t i = 0; i < n; ++i) expect(0, i, i >= off && i < off + count ? mean(i) : value(0, i), "reduce");
    reset();
    coll->broadcast(bufs, off, count);
    be->synchronize(be->default_stream());
    for (int t = 0; t < towers; ++t)
      for (std::size_t i = 0; i < n; ++i)
        expect(t, i, i >= off && i < off + count ? value(0, i) : value(t, i), "broadcast");
  }
}

// The bounded wait behind NCCL's abort: a call that returns (or throws) is waited for; one that
// blocks is given up on at the bound and runs on to its end on its own thread.
TEST(RunWithin, WaitsForACallThatReturnsAndGivesUpOnOneThatBlocks) {
  int calls = 0;
  EXPECT_TRUE(run_within([&] { ++calls; }, 600));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(run_within([] { throw std::runtime_error("a failed abort"); }, 600));
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  auto ended = std::make_shared<std::atomic<bool>>(false);
  EXPECT_FALSE(run_within(
      [gate, ended] {
        gate.wait();  // blocks until the test lets it go: no timing in the verdict
        *ended = true;
      },
      0.05));
  EXPECT_FALSE(*ended);
  release.set_value();
  for (int i = 0; i < 60000 && !*ended; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(*ended) << "the call given up on did not run on";
}

}  // namespace
}  // namespace stepbench
