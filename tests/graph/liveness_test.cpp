// Planning by liveness against what the layers really touch: a probe fills every byte of the arena
// that no live buffer holds with NaN after every piece of work (and before each pass), so a piece
// that reads a buffer outside its declared lifetime (a missing or wrong Layer::declare) reads NaN;
// the step must then give, bit for bit, what the same graph gives with every buffer its own space
// for the whole step (BufferSharing::none).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.hpp"
#include "models/models.hpp"
#include "support/chain_oracle.hpp"
#include "support/test_util.hpp"
#include "train/trainer.hpp"

namespace stepbench {
namespace {

// Poisons what is dead: after the piece of work at step k (and before a pass's first), every byte
// of the shared part of the arena that no buffer live at step k + 1 holds. It also checks that the
// pieces run in the order of the plan's schedule, by layer and name. `only_what_died` (for the real
// models, whose arenas are too large to fill a thousand times): after step k, only the bytes of the
// buffers that died there (live at k, not at k + 1, less what a buffer live at k + 1 holds); a read
// of a buffer past its declared end still reads NaN, and a write outside its lifetime still
// corrupts a live buffer, which the bit-for-bit comparison sees.
class Poisoner final : public GraphProbe {
 public:
  explicit Poisoner(Graph& g, bool only_what_died = false) : g_(g), p_(g.memory_plan()), incremental_(only_what_died) {
    for (const auto& b : p_.buffers)
      if (b.name == "parameters") base_ = reinterpret_cast<char*>(g.param_arena()) - b.offset;
  }
  // Before a pass: the step its first piece is, and everything dead poisoned.
  void start(MemoryPhase phase) {
    next_ = 0;
    while (next_ < static_cast<int>(p_.steps.size()) && p_.steps[static_cast<std::size_t>(next_)].phase != phase)
      ++next_;
    poison_all_but_live_at(next_);
  }
  void begin(Stream&, int layer, const char* part) override {
    ASSERT_LT(next_, static_cast<int>(p_.steps.size()));
    const PlanStep& st = p_.steps[static_cast<std::size_t>(next_)];
    EXPECT_EQ(st.layer, layer) << "step " << next_ << ": " << st.label << " " << st.part << ", ran " << part;
    EXPECT_EQ(st.part, part) << "step " << next_ << ": " << st.label;
  }
  void end(Stream&) override {
    ++next_;
    incremental_ ? poison_what_died_at(next_) : poison_all_but_live_at(next_);
  }
  int pieces = 0;

 private:
  std::vector<std::pair<std::size_t, std::size_t>> live_at(int step) const {
    std::vector<std::pair<std::size_t, std::size_t>> live;
    for (const auto& b : p_.buffers)
      if (!b.persistent && b.bytes && step < static_cast<int>(p_.steps.size()) && b.live_at(step))
        live.emplace_back(b.offset, b.offset + b.bytes);
    std::sort(live.begin(), live.end());
    return live;
  }
  void fill(std::size_t a, std::size_t b) {
    if (b <= a) return;
    Backend& be = g_.backend();
    be.fill(be.default_stream(), reinterpret_cast<float*>(base_ + a), std::numeric_limits<float>::quiet_NaN(),
            (b - a) / sizeof(float));
  }
  // The buffers live at step - 1 and not at step, less the bytes a buffer live at step holds.
  void poison_what_died_at(int step) {
    const auto live = live_at(step);
    for (const auto& b : p_.buffers) {
      if (b.persistent || !b.bytes || !b.live_at(step - 1)) continue;
      if (step < static_cast<int>(p_.steps.size()) && b.live_at(step)) continue;
      std::size_t at = b.offset;
      const std::size_t end = b.offset + b.bytes;
      for (const auto& [x, y] : live) {
        if (y <= at || x >= end) continue;
        fill(at, std::min(x, end));
        at = std::max(at, y);
      }
      fill(at, end);
    }
    ++pieces;
  }
  void poison_all_but_live_at(int step) {
    const std::size_t from = p_.persistent_bytes();
    std::size_t at = from;
    for (const auto& [a, b] : live_at(step)) {
      fill(at, a);
      at = std::max(at, b);
    }
    fill(at, p_.arena_bytes);
    ++pieces;
  }
  Graph& g_;
  const MemoryPlan& p_;
  char* base_ = nullptr;
  int next_ = 0;
  bool incremental_ = false;
};

struct Result {
  std::vector<float> loss, logits, inference_logits;
  std::map<std::string, std::vector<double>> grads, params;
};

// Two training steps (forward, backward, update) and an inference forward between them, the second
// step's loss, logits and gradients, the parameters after it, and the inference logits.
Result run(Graph& g, Poisoner* poison) {
  Backend& be = g.backend();
  auto& s = be.default_stream();
  init_parameters(g, 21);
  const Shape in = g.input_tensor().shape();
  const auto img = test::random_vec(static_cast<std::size_t>(in.numel()), 22);
  const std::vector<float> f(img.begin(), img.end());
  g.set_input_nchw(f.data());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(in.n));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i * 3 % 5);
  g.set_labels(labels.data());
  Trainer tr(g, OptimizerConfig{OptimizerKind::momentum, 0.05f});
  Result r;
  for (int step = 0; step < 2; ++step) {
    if (poison) poison->start(MemoryPhase::training_forward);
    tr.forward(s);
    tr.backward(s);
    tr.update(s);
    if (step == 0) {
      if (poison) poison->start(MemoryPhase::forward_only);
      g.forward(s, false);
      r.inference_logits = g.read_output("logits");
    }
  }
  r.loss = g.loss_terms(s);
  r.logits = g.read_output("logits");
  r.grads = test::graph_grads(g);
  r.params = test::graph_params(g);
  return r;
}

void expect_same(const Result& a, const Result& b) {
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.inference_logits, b.inference_logits);
  EXPECT_EQ(a.grads, b.grads);
  EXPECT_EQ(a.params, b.params);
  for (float v : a.logits) ASSERT_TRUE(std::isfinite(v));
}

// Builds the net twice (shared by liveness and poisoned, recomputing as `recompute` says; every
// buffer its own, nothing recomputed) and compares. Returns the shared plan.
template <class Build>
MemoryPlan expect_liveness_holds(Layout l, std::int64_t batch, Build build, Recompute recompute = Recompute::automatic,
                                 bool only_what_died = false, Fuse fuse = Fuse::off) {
  auto be = make_cpu_backend();
  // fused: the units' statistics, factors and reserve hold canaries, checked where they are read
  be->set_fused_canaries(fuse == Fuse::on);
  Result r[2];
  MemoryPlan plan;
  for (const BufferSharing sharing : {BufferSharing::none, BufferSharing::by_liveness}) {
    GraphConfig cfg{batch, l, DType::f32, 3};
    cfg.sharing = sharing;
    cfg.recompute = recompute;
    cfg.fuse = fuse;  // the unshared plan never fuses (GraphConfig::fuse needs sharing by liveness): the unfused step
    Graph g(*be, cfg);
    build(g);
    g.plan();
    EXPECT_TRUE(plan_conflicts(g.memory_plan()).empty());
    const bool shared = sharing == BufferSharing::by_liveness;
    Poisoner poison(g, only_what_died);
    if (shared) {
      EXPECT_LT(g.device_bytes(), g.memory_plan().unshared_bytes());
      g.set_probe(&poison);
    }
    r[shared] = run(g, shared ? &poison : nullptr);
    if (shared) {
      EXPECT_GT(poison.pieces, 10);
      plan = g.memory_plan();
    }
  }
  expect_same(r[1], r[0]);
  return plan;
}

const PlannedBuffer& buffer_named(const MemoryPlan& p, const std::string& name) {
  for (const auto& b : p.buffers)
    if (b.name == name) return b;
  throw std::runtime_error("no buffer " + name);
}

TEST(Liveness, TinyStepsWithDeadBuffersPoisonedEqualTheUnsharedPlan) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    SCOPED_TRACE(to_string(l));
    expect_liveness_holds(l, 4, [](Graph& g) {
      ModelOptions o;
      o.image_size = 32;
      o.num_classes = 5;
      build_model(g, ModelKind::tiny, o);
    });
  }
}

// What tiny has not: a concat part with a consumer of its own (its root's gradient is zeroed, then
// accumulated into), a value feeding three layers, an output nobody's loss reads (its gradient is
// zeroed), max and average pooling, dropout.
TEST(Liveness, FanOutConcatAndZeroedGradientsWithDeadBuffersPoisonedEqualTheUnsharedPlan) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    SCOPED_TRACE(to_string(l));
    expect_liveness_holds(l, 3, [](Graph& g) {
      auto x = g.input(3, 12, 12);
      auto stem = g.conv_bn_relu("stem", x, 8, {3, 3, 1, 1, 1, 1});
      auto a = g.conv_bn_relu("a", stem, 4, {1, 1});
      auto b = g.conv_bn_relu("b", stem, 4, {3, 3, 1, 1, 1, 1});
      auto c = g.pool(stem, {PoolKind::max, 3, 3, 1, 1, 1, 1});
      auto cat = g.concat({a, b, c});
      auto side = g.conv_bn_relu("side", a, 2, {1, 1});  // a part with a consumer of its own
      auto unused = g.linear("unused", g.global_avg_pool(side), 3);
      (void)unused;  // no loss reads it: its gradient is zero
      auto p = g.pool(cat, {PoolKind::avg_include_pad, 3, 3, 2, 2, 0, 0});
      auto d = g.dropout(g.global_avg_pool(g.conv_bn_relu("d", p, 6, {1, 1})), 0.3);
      g.cross_entropy(g.linear("fc", d, 5), 1.0f, "logits");
    });
  }
}

// Recomputation (GraphConfig::recompute): a unit's output freed after the forward and made again in
// backward gives the same step bit for bit, with every dead byte poisoned: a single unit (large
// enough for oneDNN's batch norm on an AVX-512 cpu, NHWC), a concat of two units (recomputed as a
// whole), a conv + BN without ReLU feeding a residual add (its output read by nothing in backward:
// not kept, not recomputed), and a max pool's input (kept: the pool makes no recompute).
TEST(Liveness, RecomputedOutputsGiveTheSameStepBitForBit) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    SCOPED_TRACE(to_string(l));
    const auto build = [](Graph& g) {
      auto x = g.input(3, 64, 64);
      auto big = g.conv_bn_relu("big", x, 16, {3, 3, 1, 1, 1, 1});
      auto a = g.conv_bn_relu("a", big, 8, {1, 1});
      auto b = g.conv_bn_relu("b", big, 8, {3, 3, 1, 1, 1, 1});
      auto cat = g.concat({a, b});
      ConvBnSpec spec{"c.weight", "c.bn", false, 1e-5, ParamInit::normal, 0.1f};
      auto c = g.conv_bn("c", cat, 16, {1, 1}, spec);
      auto res = g.add_relu(c, big, "res");
      auto p = g.pool(res, {PoolKind::max, 2, 2, 2, 2, 0, 0}, "pool");
      auto d = g.conv_bn_relu("d", p, 8, {3, 3, 2, 2, 1, 1});
      g.cross_entropy(g.linear("fc", g.global_avg_pool(d), 5), 1.0f, "logits");
    };
    const MemoryPlan on = expect_liveness_holds(l, 2, build, Recompute::on);
    for (const char* name : {"big output", "concat(a, ...)", "d output"}) {
      SCOPED_TRACE(name);
      const PlannedBuffer& buf = buffer_named(on, name);
      EXPECT_TRUE(buf.recomputed);
      EXPECT_NE(buf.kind, BufferKind::saved);  // its forward lifetime ends before backward
    }
    EXPECT_FALSE(buffer_named(on, "c output").recomputed);  // nothing reads it in backward
    EXPECT_NE(buffer_named(on, "c output").kind, BufferKind::saved);
    EXPECT_EQ(buffer_named(on, "res output").kind, BufferKind::saved);  // add + ReLU: not recomputed
    // each output made again once, before its first reader in backward ("big" has two: a and b)
    std::map<int, int> remakes;
    for (const auto& s : on.steps)
      if (s.part == "bn_relu_recompute" || s.part == "bn_recompute") ++remakes[s.layer];
    EXPECT_EQ(remakes.size(), 4u);  // big, a and b (the concat's parts), d
    for (const auto& [layer, n] : remakes) EXPECT_EQ(n, 1) << "layer " << layer << " recomputed " << n << " times";
    const MemoryPlan off = expect_liveness_holds(l, 2, build, Recompute::off);
    EXPECT_FALSE(buffer_named(off, "big output").recomputed);
    EXPECT_EQ(buffer_named(off, "big output").kind, BufferKind::saved);
    EXPECT_LT(memory_peaks(on)[static_cast<int>(MemoryPhase::backward)].bytes,
              memory_peaks(off)[static_cast<int>(MemoryPhase::backward)].bytes);
  }
}

// Fused units (GraphConfig::fuse), poisoned and with canaries in each unit's statistics, factors and
// reserve (Backend::set_fused_canaries), against the unshared unfused step: a chain of units
// whose outputs are loaded through their batch norm (one feeding two convolutions, one read by the
// training-only head too), residual adds with one and with both inputs loaded so (ResNet's identity
// and downsample blocks), and outputs that stay stored (read by a pool, by a concat's part, by an
// add from a unit with ReLU), recompute on and off.
TEST(Liveness, FusedUnitsWithDeadBuffersPoisonedGiveTheUnfusedStep) {
  for (Layout l : {Layout::nchw, Layout::nhwc})
    for (Recompute r : {Recompute::off, Recompute::on}) {
      SCOPED_TRACE(fmt::format("{}, recompute {}", to_string(l), to_string(r)));
      const MemoryPlan plan = expect_liveness_holds(
          l, 2,
          [](Graph& g) {
            auto no_relu = [&](const std::string& n, ValueId x, std::int64_t c, ConvParams p) {
              return g.conv_bn(n, x, c, p, {n + ".weight", n + ".bn", false, 1e-5, ParamInit::normal, 0.2f});
            };
            auto x = g.input(3, 16, 16);
            auto stem = g.conv_bn_relu("stem", x, 8, {3, 3, 1, 1, 1, 1});  // read by a pool and a conv
            auto a = g.conv_bn_relu("a", stem, 6, {1, 1});                 // read by b1, b2
            auto b1 = g.conv_bn_relu("b1", a, 4, {3, 3, 1, 1, 1, 1});
            auto b2 = g.conv_bn_relu("b2", a, 4, {1, 3, 1, 1, 0, 1});
            auto cat = g.concat({b1, b2, g.pool(stem, {PoolKind::max, 3, 3, 1, 1, 1, 1})});   // 16 channels
            auto r1 = g.add_relu(no_relu("r1", cat, 16, {3, 3, 1, 1, 1, 1}), cat, "r1.add");  // one loaded
            auto r2 = g.add_relu(no_relu("r2", r1, 12, {3, 3, 2, 2, 1, 1}),
                                 no_relu("r2.down", r1, 12, {1, 1, 2, 2, 0, 0}), "r2.add");  // both loaded
            auto c = g.conv_bn_relu("c", r2, 8, {1, 1});  // read by d and by the training-only head
            auto d = g.conv_bn_relu("d", c, 8, {3, 3, 1, 1, 1, 1});
            g.set_training_only(true);
            g.cross_entropy(g.linear("aux", g.global_avg_pool(g.conv_bn_relu("aux.conv", c, 4, {1, 1})), 5), 0.3f,
                            "aux_logits");
            g.set_training_only(false);
            g.cross_entropy(g.linear("fc", g.global_avg_pool(d), 5), 1.0f, "logits");
          },
          r, false, Fuse::on);
      for (const char* name : {"a output", "r1 output", "r2 output", "r2.down output", "c output"})
        EXPECT_THROW(buffer_named(plan, name), std::runtime_error) << name << " is not stored";
      for (const char* name : {"stem output", "r1.add output", "d output", "aux.conv output"})
        EXPECT_NO_THROW(buffer_named(plan, name)) << name << " is stored";
    }
}

// The real models, whose plans nothing else runs poisoned: Inception-v3 with its aux head (which
// needs 299x299: Mixed_6e must be 17x17), ResNet-50 at 64x64 (its downsample shortcuts, the
// residual adds) and the zoo's below, batch 2, both layouts, recompute on and off. A buffer interval one step short
// anywhere (a concat part, the aux head's input, a shortcut) reads NaN and fails the comparison.
struct RealModel {
  ModelKind kind;
  int image_size;
};
class LivenessOfRealModels : public ::testing::TestWithParam<std::tuple<RealModel, Layout, Recompute, Fuse>> {};

TEST_P(LivenessOfRealModels, DeadBuffersPoisonedGiveTheUnsharedStepBitForBit) {
  const auto [m, l, recompute, fuse] = GetParam();
  const MemoryPlan plan = expect_liveness_holds(
      l, 2,
      [m = m](Graph& g) {
        ModelOptions o;
        o.image_size = m.image_size;
        o.num_classes = 10;
        o.aux_logits = true;
        build_model(g, m.kind, o);
      },
      recompute, true, fuse);
  if (m.kind == ModelKind::inception_v3) {
    bool aux = false;
    for (const auto& b : plan.buffers) aux = aux || b.name.rfind("AuxLogits", 0) == 0;
    EXPECT_TRUE(aux) << "the aux head is planned";
  }
}

std::string real_model_name(const testing::TestParamInfo<LivenessOfRealModels::ParamType>& info) {
  const RealModel m = std::get<0>(info.param);
  return fmt::format("{}_{}_recompute_{}{}", model_entry(m.kind).name, to_string(std::get<1>(info.param)),
                     std::get<2>(info.param) == Recompute::on ? "on" : "off",
                     std::get<3>(info.param) == Fuse::on ? "_fused" : "");
}
// The model zoo's: AlexNet at its smallest (the adaptive pool repeating a 1x1 map; VGG-16 has the same
// layer kinds and takes 26 s a case here, its 25088 x 4096 fc), DenseNet-121 at 64x64 (every layer
// reading its block's concatenation so far, the prefixes' BN + ReLU recomputed; at 32x32 block 4's
// batch norms see 2 values a channel and the first step blows the weights up to infinity),
// MobileNet-v2 at 64x64 (depthwise convolutions, ReLU6, residual adds without a ReLU)
const auto kRealModels = ::testing::Values(RealModel{ModelKind::inception_v3, 299}, RealModel{ModelKind::resnet50, 64},
                                           RealModel{ModelKind::alexnet, 63}, RealModel{ModelKind::densenet121, 64},
                                           RealModel{ModelKind::mobilenet_v2, 64});
INSTANTIATE_TEST_SUITE_P(Models, LivenessOfRealModels,
                         ::testing::Combine(kRealModels, ::testing::Values(Layout::nchw, Layout::nhwc),
                                            ::testing::Values(Recompute::off, Recompute::on),
                                            ::testing::Values(Fuse::off)),
                         real_model_name);
// Fused, with canaries (against the unshared unfused step): recompute off, where every unstored output
// would have been saved (FuseSteps runs recompute on and off, unpoisoned, in fp32 and bf16)
INSTANTIATE_TEST_SUITE_P(FusedModels, LivenessOfRealModels,
                         ::testing::Combine(kRealModels, ::testing::Values(Layout::nchw, Layout::nhwc),
                                            ::testing::Values(Recompute::off), ::testing::Values(Fuse::on)),
                         real_model_name);

}  // namespace
}  // namespace stepbench
