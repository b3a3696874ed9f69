// The projection's alpha-beta model (bench/projection.hpp) against figures worked by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/projection.hpp"

namespace stepbench {
namespace {

// forward 10 ms, backward 20 ms, update 1 ms; two buckets of 1 MB, ready 5 ms and 20 ms into backward;
// a link of 8 Gb/s (1e6 bytes per ms) and 10 us per hop
ProjectionInput gpu_input() {
  ProjectionInput in;
  in.forward_ms = 10;
  in.backward_ms = 20;
  in.update_ms = 1;
  in.buckets = {{5, 1e6}, {20, 1e6}};
  return in;
}
const LinkModel kLink{"given", 8, 10};

TEST(Projection, OneGpuSyncsNothing) {
  const auto p = project(gpu_input(), kLink, {1});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_DOUBLE_EQ(p[0].step_ms, 31);
  EXPECT_DOUBLE_EQ(p[0].sync_ms, 0);
  EXPECT_DOUBLE_EQ(p[0].efficiency, 1);
  EXPECT_EQ(p[0].algorithm, "none");
}

TEST(Projection, RingForLargeBucketsAndTheLastBucketIsExposed) {
  // N = 4: ring 2*3*(0.01 + 1e6/4e6) = 1.56 ms, tree 2*2*0.01 + 2*1 = 2.04 ms: ring. Bucket 0 runs
  // 5..6.56, bucket 1 waits for backward's end, 20..21.56: 1.56 ms exposed.
  const auto p = project(gpu_input(), kLink, {4});
  EXPECT_NEAR(p[0].sync_ms, 3.12, 1e-9);
  EXPECT_NEAR(p[0].exposed_ms, 1.56, 1e-9);
  EXPECT_NEAR(p[0].step_ms, 32.56, 1e-9);
  EXPECT_NEAR(p[0].efficiency, 31 / 32.56, 1e-12);
  EXPECT_EQ(p[0].algorithm, "ring");
}

TEST(Projection, TreeForSmallBucketsOnManyGpus) {
  // N = 1024, 1 kB buckets: ring 2*1023*(0.01 + 1e3/1.024e9) = 20.46 ms, tree 2*10*0.01 + 2e-3 = 0.202 ms
  ProjectionInput in = gpu_input();
  in.buckets = {{0, 1e3}};
  const auto p = project(in, kLink, {1024});
  EXPECT_EQ(p[0].algorithm, "tree");
  EXPECT_NEAR(p[0].sync_ms, 0.202, 1e-9);
  EXPECT_NEAR(p[0].exposed_ms, 0, 1e-12);  // done long before backward ends
  EXPECT_NEAR(p[0].step_ms, 31, 1e-12);
}

TEST(Projection, BucketsQueueBehindEachOther) {
  // both ready at once: the second starts when the first ends
  ProjectionInput in = gpu_input();
  in.buckets = {{19, 1e6}, {19, 1e6}};
  const auto p = project(in, kLink, {2});  // ring 2*1*(0.01 + 0.5) = 1.02 each
  EXPECT_NEAR(p[0].exposed_ms, 19 + 2 * 1.02 - 20, 1e-9);
}

TEST(Projection, CpuTowersRunOneAfterAnother) {
  ProjectionInput in = gpu_input();
  in.sequential = true;
  // 4 towers: 4 x 31 ms of compute; host sums alpha + 2*3*1e6/1e6 = 6.01 ms per bucket, from the last
  // tower's backward: 5..11.01, then 20..26.01: 6.01 exposed
  const auto p = project(in, kLink, {4});
  EXPECT_EQ(p[0].algorithm, "host");
  EXPECT_NEAR(p[0].step_ms, 124 + 6.01, 1e-9);
  EXPECT_NEAR(p[0].efficiency, 31 / (124 + 6.01), 1e-12);
}

TEST(Projection, FabricPresets) {
  EXPECT_EQ(fabric_preset("ib-ndr").gbps, 400);
  EXPECT_EQ(fabric_preset("ib-ndr").latency_us, 5);
  EXPECT_TRUE(fabric_preset("no-such").name.empty());
  for (const auto& n : fabric_names()) EXPECT_GT(fabric_preset(n).gbps, 0) << n;
}

}  // namespace
}  // namespace stepbench
