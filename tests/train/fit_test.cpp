// The largest batch the memory plan accepts, known before anything is allocated: it runs, and one
// more image is refused at planning with the bytes its plan needs (cpu backend, a memory limit).
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "support/test_util.hpp"
#include "train/towers.hpp"

namespace stepbench {
namespace {

TowerOptions tiny_within(std::size_t limit_bytes) {
  TowerOptions o;
  o.backend = BackendKind::cpu;
  o.model = ModelKind::tiny;
  o.model_options.image_size = 32;
  o.model_options.num_classes = 10;
  o.layout = Layout::nhwc;  // on AVX-512 the filters in oneDNN's blocked formats: sized as a run has them
  o.memory_limit_bytes = limit_bytes;
  return o;
}

TEST(LargestBatch, ThePlansLargestBatchRunsAndOneMoreIsRefusedWithItsBytes) {
  TowerOptions o = tiny_within(std::size_t{24} << 20);
  const BatchFit fit = largest_batch_that_fits(o);
  ASSERT_GT(fit.batch, 4);
  ASSERT_FALSE(fit.at_cap);
  EXPECT_LE(fit.bytes, fit.usable);
  EXPECT_GT(fit.next_bytes, fit.usable);
  EXPECT_LT(fit.usable, fit.budget);

  o.batch_per_tower = fit.batch;
  {
    Towers t(o);
    EXPECT_EQ(t.graph(0).device_bytes(), fit.bytes) << "the run's plan is the one sized before it";
    t.set_synthetic_batch(3);
    t.step();
    t.synchronize();
    EXPECT_TRUE(std::isfinite(t.loss(0)));
  }
  o.batch_per_tower = fit.batch + 1;
  try {
    Towers t(o);
    ADD_FAILURE() << "batch " << fit.batch + 1 << " planned";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("batch size {} needs {} bytes", fit.batch + 1, fit.next_bytes)), std::string::npos)
        << what;
    EXPECT_NE(what.find("a memory limit of 24 MiB is set"), std::string::npos) << what;
  }
}

// The quick estimate is a lower bound of the plan (its peak of live bytes before the ops' buffers),
// so what it refuses the plan refuses too.
TEST(LargestBatch, TheQuickEstimateIsALowerBoundOfThePlan) {
  const TowerOptions o = tiny_within(0);
  for (std::int64_t b : {1, 7, 64}) {
    const auto quick = plan_memory(o, b, true), exact = plan_memory(o, b);
    EXPECT_TRUE(quick.fits && exact.fits);
    EXPECT_LT(quick.bytes, exact.bytes) << "batch " << b;
    EXPECT_GT(quick.bytes, exact.bytes / 2) << "batch " << b;
  }
}

}  // namespace
}  // namespace stepbench
