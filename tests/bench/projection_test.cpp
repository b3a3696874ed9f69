// The projection's alpha-beta model (bench/projection.hpp) against figures worked by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/fabric.hpp"
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
const Fabric kLink{{"given", 8, 10}, {}, 0, ""};

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

// One GPU's whole step, timed, holds what the parts leave out (the loss, gradient zeroing, the gaps
// between phases): 4 CPU towers repeat it 4 times, one GPU once, and the exposed sync stays
TEST(Projection, TheTimedStepIsWhatEveryTowerRepeats) {
  ProjectionInput in = gpu_input();
  set_measured_step(in, 33);
  in.sequential = true;
  const auto cpu = project(in, kLink, {4});
  EXPECT_NEAR(cpu[0].step_ms, 4 * 33 + 6.01, 1e-9);
  EXPECT_NEAR(cpu[0].efficiency, 33 / (4 * 33 + 6.01), 1e-12);
  in.sequential = false;
  const auto gpu = project(in, kLink, {1, 4});
  EXPECT_DOUBLE_EQ(gpu[0].step_ms, 33);
  EXPECT_NEAR(gpu[1].exposed_ms, 1.56, 1e-9);
  EXPECT_NEAR(gpu[1].step_ms, 33 + 1.56, 1e-9);
  // shorter than the probed parts (the probes cost time): the timed step still
  set_measured_step(in, 30);
  EXPECT_DOUBLE_EQ(project(in, kLink, {1})[0].step_ms, 30);
}

// --gpus-per-node: with every GPU in one node the projection is the flat one over the node's link;
// across nodes the node's fast link makes it no slower than the flat network alone
TEST(Projection, TwoLevelsAsTheFlatModelInOneNodeAndFasterAcross) {
  const LinkModel nv{"nvlink4", 3600, 3}, ib{"ib-ndr", 400, 5};
  const Fabric two{ib, nv, 8, ""};
  Fabric flat_nv, flat_ib;  // one flat link (member by member: GCC 12 at -O3 saw `node` uninitialised)
  flat_nv.between = nv;
  flat_ib.between = ib;
  for (int g : {2, 4, 8})
    EXPECT_DOUBLE_EQ(project(gpu_input(), two, {g})[0].step_ms, project(gpu_input(), flat_nv, {g})[0].step_ms) << g;
  ProjectionInput in = gpu_input();
  in.buckets = {{5, 1e8}, {20, 1e8}};  // big enough for the bandwidth to matter
  const auto a = project(in, two, {64})[0], b = project(in, flat_ib, {64})[0];
  EXPECT_LT(a.sync_ms, b.sync_ms);
  EXPECT_NE(a.algorithm.find("2-level"), std::string::npos) << a.algorithm;
}

// the straggler band: none without samples, for one GPU or for cpu towers; wider at more GPUs
TEST(Projection, StragglerBandFromTheStepSpread) {
  ProjectionInput in = gpu_input();
  EXPECT_EQ(project(in, kLink, {64})[0].tax_hi_ms, 0);
  for (int i = 0; i < 50; ++i) in.step_samples.push_back(31 + 0.1 * ((i * 7) % 11 - 5));
  const auto p = project(in, kLink, {1, 8, 1024});
  EXPECT_EQ(p[0].tax_hi_ms, 0);
  EXPECT_GT(p[1].tax_lo_ms, 0);
  EXPECT_LE(p[1].tax_lo_ms, p[1].tax_hi_ms);
  EXPECT_GT(p[2].tax_lo_ms, p[1].tax_lo_ms);
  EXPECT_GT(p[2].tax_hi_ms, p[1].tax_hi_ms);
  const StragglerTax direct = straggler_tax(in.step_samples, 1024);
  EXPECT_DOUBLE_EQ(p[2].tax_lo_ms, direct.lo_ms);
  in.sequential = true;
  EXPECT_EQ(project(in, kLink, {8})[0].tax_hi_ms, 0);
}

// --fabric-from run: links fitted to a run's grad_sync levels give back, for the run's own buckets,
// the time each level took, whatever the level's share (here the within-node levels differ, so a
// plain mean of their busbws would miss); and the run's algorithm is kept where another is faster
TEST(Projection, LinksFittedToARunsSyncGiveItsTimesBack) {
  ProjectionInput in = gpu_input();
  in.buckets = {{0, 3e6}, {0, 5e6}, {0, 2e6}};
  const double bytes = 1e7;
  // 8 processes as 2 nodes of 4, levels timed as the host collective counts them (set_level_counters:
  // busbw = bytes per process and call x bus factor / time)
  const double g = 4, m = 2, rs_ms = 30, x_ms = 12, ag_ms = 10;
  RunLinks r;
  r.per_node = 4;
  r.node_reduce_scatter_GBps = bytes * (g - 1) / g / (rs_ms / 1e3) / 1e9;
  r.across_GBps = bytes / g * 2 * (m - 1) / m / (x_ms / 1e3) / 1e9;
  r.node_all_gather_GBps = bytes * (g - 1) / g / (ag_ms / 1e3) / 1e9;
  const Fabric two = fabric_from_run(r);
  EXPECT_EQ(two.algorithm, "2-level");
  const auto p = project(in, two, {8})[0];
  EXPECT_NEAR(p.sync_ms, rs_ms + x_ms + ag_ms, 1e-9);
  EXPECT_EQ(p.algorithm, "2-level");
  // flat: Gloo's ring over the 8 processes, the grad_sync's busbw (2 (n-1) / n bytes over its time)
  RunLinks flat;
  flat.flat_GBps = bytes * 2 * 7 / 8 / (40 / 1e3) / 1e9;
  const Fabric ring = fabric_from_run(flat);
  EXPECT_NEAR(project(in, ring, {8})[0].sync_ms, 40, 1e-9);
  // pinned: a latency that makes the tree faster for a small bucket still projects the ring
  Fabric slow = ring;
  slow.between.latency_us = 1e4;
  in.buckets = {{0, 1e3}};
  EXPECT_EQ(project(in, slow, {64})[0].algorithm, "ring");
  slow.algorithm.clear();
  EXPECT_EQ(project(in, slow, {64})[0].algorithm, "tree");
}

TEST(Projection, FabricPresets) {
  EXPECT_EQ(fabric_preset("ib-ndr").gbps, 400);
  EXPECT_EQ(fabric_preset("ib-ndr").latency_us, 5);
  EXPECT_TRUE(fabric_preset("no-such").name.empty());
  for (const auto& n : fabric_names()) EXPECT_GT(fabric_preset(n).gbps, 0) << n;
}

}  // namespace
}  // namespace stepbench
