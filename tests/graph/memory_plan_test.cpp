// The memory plan by liveness (graph/memory_plan.hpp): the checker catches two live buffers given
// one offset, and passes the real plans of tiny and Inception-v3; buffers whose lifetimes do not
// overlap share space; the peaks per phase.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "graph/graph.hpp"
#include "graph/liveness.hpp"
#include "models/models.hpp"
#include "support/test_util.hpp"

namespace stepbench {
namespace {

PlannedBuffer buffer(std::string name, std::size_t bytes, std::vector<LiveInterval> live) {
  PlannedBuffer b;
  b.name = std::move(name);
  b.bytes = bytes;
  b.live = std::move(live);
  return b;
}

// Six steps: two of the inference forward, two of the training forward, one of backward, the update.
MemoryPlan six_steps() {
  MemoryPlan p;
  for (auto ph : {MemoryPhase::forward_only, MemoryPhase::forward_only, MemoryPhase::training_forward,
                  MemoryPhase::training_forward, MemoryPhase::backward, MemoryPhase::update})
    p.steps.push_back({ph, 0, "fwd", "layer"});
  return p;
}

TEST(MemoryPlan, BuffersLiveAtDifferentStepsShareSpace) {
  MemoryPlan p = six_steps();
  PlannedBuffer w = buffer("weights", 1024, {});
  w.persistent = true;
  p.buffers = {w, buffer("a", 512, {{2, 3}}), buffer("b", 512, {{4, 4}}), buffer("c", 256, {{3, 4}}),
               buffer("d", 256, {{0, 1}, {5, 5}})};
  assign_offsets(p);
  EXPECT_EQ(p.buffers[0].offset, 0u);                   // the persistent buffers first
  EXPECT_EQ(p.buffers[1].offset, p.buffers[2].offset);  // a and b never live together
  EXPECT_NE(p.buffers[3].offset, p.buffers[1].offset);  // c overlaps both in time
  EXPECT_EQ(p.arena_bytes, 1024u + 512 + 256);          // d fits where a and b are
  EXPECT_EQ(p.unshared_bytes(), 1024u + 512 + 512 + 256 + 256);
  EXPECT_TRUE(plan_conflicts(p).empty()) << fmt::format("{}", fmt::join(plan_conflicts(p), "\n"));

  const auto peaks = memory_peaks(p);
  EXPECT_EQ(peaks[0].bytes, 1024u + 256);  // forward-only: the weights and d
  EXPECT_EQ(peaks[1].bytes, 1024u + 512 + 256);
  EXPECT_EQ(peaks[1].step, 3);
  EXPECT_EQ(peaks[2].bytes, 1024u + 512 + 256);
  EXPECT_EQ(peaks[3].bytes, 1024u + 256);
  EXPECT_EQ(overall_peak(p).phase, MemoryPhase::training_forward);  // the first of two equal peaks
}

// A buffer goes into the tightest gap among the buffers live when it is (best fit): X1, X2 and X3
// live throughout leave two gaps once G1 and G2 are dead, 500 bytes at 1000 and 320 at 1900; Y (300
// bytes, steps 3-4) takes the second. First fit would take the first, no reuse would put it past X3.
TEST(MemoryPlan, ABufferTakesTheTightestGapThatHoldsIt) {
  MemoryPlan p = six_steps();
  p.buffers = {buffer("X1", 1000, {{0, 5}}), buffer("G1", 500, {{0, 1}}), buffer("X2", 400, {{0, 5}}),
               buffer("G2", 320, {{0, 1}}),  buffer("X3", 310, {{0, 5}}), buffer("Y", 300, {{3, 4}})};
  assign_offsets(p);
  const std::vector<std::size_t> want = {0, 1000, 1500, 1900, 2220, 1900};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(p.buffers[i].offset, want[i]) << p.buffers[i].name;
  EXPECT_EQ(p.arena_bytes, 2530u);
  EXPECT_TRUE(plan_conflicts(p).empty()) << fmt::format("{}", fmt::join(plan_conflicts(p), "\n"));
}

// A planted overlap: two buffers live at one step given one offset. The checker names both and
// the step, and a buffer past the arena's end.
TEST(MemoryPlan, TheCheckerCatchesTwoLiveBuffersAtOneOffset) {
  MemoryPlan p = six_steps();
  p.buffers = {buffer("a", 512, {{2, 3}}), buffer("b", 512, {{3, 4}})};
  assign_offsets(p);
  ASSERT_TRUE(plan_conflicts(p).empty());
  p.buffers[1].offset = p.buffers[0].offset + 256;  // half over a, at step 3
  const auto bad = plan_conflicts(p);
  ASSERT_EQ(bad.size(), 1u) << fmt::format("{}", fmt::join(bad, "\n"));
  EXPECT_NE(bad[0].find("step 3 (training forward: layer fwd)"), std::string::npos) << bad[0];
  EXPECT_NE(bad[0].find("'a'"), std::string::npos) << bad[0];
  EXPECT_NE(bad[0].find("'b'"), std::string::npos) << bad[0];
  p.buffers[1].offset = p.arena_bytes;  // clear of a, but past the end
  ASSERT_EQ(plan_conflicts(p).size(), 1u);
  EXPECT_NE(plan_conflicts(p)[0].find("past the arena"), std::string::npos);
}

MemoryPlan plan_of(ModelKind m, std::int64_t batch, int image, Layout l, bool aux = false,
                   Recompute recompute = Recompute::automatic) {
  auto be = make_cpu_backend();
  be->set_sizing_only(true);  // the plan without running anything
  GraphConfig cfg{batch, l};
  cfg.recompute = recompute;
  Graph g(*be, cfg);
  ModelOptions o;
  o.image_size = image;
  o.num_classes = 10;
  o.aux_logits = aux;
  build_model(g, m, o);
  g.plan_dry(false);
  return g.memory_plan();
}

// The real plans pass the checker; planting an overlap between two buffers of them (the first two
// live at one step, given one offset) is caught.
void expect_sound_and_checked(MemoryPlan p) {
  EXPECT_TRUE(plan_conflicts(p).empty()) << fmt::format("{}", fmt::join(plan_conflicts(p), "\n"));
  EXPECT_LT(p.arena_bytes, p.unshared_bytes());
  EXPECT_LE(overall_peak(p).bytes, p.arena_bytes);
  for (std::size_t i = 0; i < p.buffers.size(); ++i) {
    for (std::size_t j = i + 1; j < p.buffers.size(); ++j) {
      auto &a = p.buffers[i], &b = p.buffers[j];
      if (a.persistent || b.persistent || !a.bytes || !b.bytes || !a.overlaps_in_time(b)) continue;
      SCOPED_TRACE(a.name + " and " + b.name);
      b.offset = a.offset;
      const auto bad = plan_conflicts(p);
      ASSERT_FALSE(bad.empty());
      EXPECT_NE(bad[0].find("'" + a.name + "'"), std::string::npos) << bad[0];
      EXPECT_NE(bad[0].find("'" + b.name + "'"), std::string::npos) << bad[0];
      return;
    }
  }
  ADD_FAILURE() << "no two buffers live at one step";
}

TEST(MemoryPlan, TinysPlanIsSound) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) expect_sound_and_checked(plan_of(ModelKind::tiny, 8, 32, l));
}

TEST(MemoryPlan, InceptionV3sPlanIsSound) {
  const MemoryPlan p = plan_of(ModelKind::inception_v3, 2, 299, Layout::nhwc, true);
  expect_sound_and_checked(p);
  const auto peaks = memory_peaks(p);
  for (const auto& m : peaks) {
    std::string what;
    for (std::size_t k = 0; k < kBufferKinds; ++k)
      what += fmt::format(" {} {:.1f}", to_string(static_cast<BufferKind>(k)), m.by_kind[k] / 1048576.0);
    std::cout << fmt::format("{}: {:.1f} MiB at step {}:{}\n", to_string(m.phase), m.bytes / 1048576.0, m.step, what);
  }
  std::cout << fmt::format("arena {:.1f} MiB, unshared {:.1f} MiB\n", p.arena_bytes / 1048576.0,
                           p.unshared_bytes() / 1048576.0);
  // the backward holds what the forward saved, so it peaks above the forward-only pass
  EXPECT_GT(peaks[static_cast<int>(MemoryPhase::backward)].bytes, peaks[0].bytes);
  EXPECT_GT(peaks[static_cast<int>(MemoryPhase::backward)].by_kind[static_cast<int>(BufferKind::saved)], 0u);
}

// Recomputing the conv + BN outputs in backward (GraphConfig::recompute) takes them out of what the
// forward saves. Measured at batch 8, NHWC: Inception-v3's backward peak 0.70x the plan that keeps
// them, what it saves 0.58x (its pre-norm outputs and pooling outputs stay); ResNet-50's 0.86x and
// 0.81x (its residual sums stay too).
TEST(MemoryPlan, RecomputingTheConvOutputsLowersTheBackwardsPeak) {
  struct Case {
    ModelKind m;
    int image;
    double peak, saved;  // the most each may be of the plan without recomputation
  };
  for (auto [m, image, most_peak, most_saved] :
       {Case{ModelKind::inception_v3, 299, 0.75, 0.65}, Case{ModelKind::resnet50, 224, 0.9, 0.85}}) {
    SCOPED_TRACE(std::string(to_string(m)));
    const MemoryPlan on = plan_of(m, 8, image, Layout::nhwc, m == ModelKind::inception_v3, Recompute::on);
    const MemoryPlan off = plan_of(m, 8, image, Layout::nhwc, m == ModelKind::inception_v3, Recompute::off);
    expect_sound_and_checked(on);
    const auto b = static_cast<int>(MemoryPhase::backward), saved = static_cast<int>(BufferKind::saved);
    const MemoryPeak pon = memory_peaks(on)[b], poff = memory_peaks(off)[b];
    std::cout << fmt::format("backward peak {:.1f} MiB against {:.1f} MiB ({:.2f}x); saved {:.1f} against {:.1f} MiB\n",
                             pon.bytes / 1048576.0, poff.bytes / 1048576.0,
                             static_cast<double>(pon.bytes) / static_cast<double>(poff.bytes),
                             pon.by_kind[saved] / 1048576.0, poff.by_kind[saved] / 1048576.0);
    EXPECT_LT(static_cast<double>(pon.bytes), most_peak * static_cast<double>(poff.bytes));
    EXPECT_LT(static_cast<double>(pon.by_kind[saved]), most_saved * static_cast<double>(poff.by_kind[saved]));
    int recomputed = 0;
    for (const auto& buf : on.buffers) recomputed += buf.recomputed;
    EXPECT_GT(recomputed, 10);
    for (const auto& buf : off.buffers) EXPECT_FALSE(buf.recomputed) << buf.name;
    // the recompute pieces are steps of the plan's backward, named as their probes
    EXPECT_TRUE(std::any_of(on.steps.begin(), on.steps.end(), [](const PlanStep& st) {
      return st.phase == MemoryPhase::backward && st.part == "bn_relu_recompute";
    }));
  }
}

}  // namespace
}  // namespace stepbench
