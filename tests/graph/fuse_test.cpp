// Fused convolution + batch-norm units (GraphConfig::fuse, backend/fused.hpp) in the graph: which
// units the planner fuses in ResNet-50 and Inception-v3 and which values it must leave stored, the
// whole step fused against the unfused one (both networks, both layouts, fp32 and bf16; ResNet-50
// also without recompute), and the memory the unstored outputs free. The small nets fused against
// the float64 oracle are in graph_test.cpp, poisoned plans in liveness_test.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.hpp"
#include "models/models.hpp"
#include "support/chain_oracle.hpp"
#include "support/test_util.hpp"

namespace stepbench {
namespace {

std::unique_ptr<Graph> model(Backend& be, ModelKind k, std::int64_t image, Layout l, DType t, Fuse f,
                             Recompute r = Recompute::automatic, std::int64_t batch = 2) {
  GraphConfig cfg{batch, l, t, 5};
  cfg.fuse = f;
  cfg.recompute = r;
  auto g = std::make_unique<Graph>(be, cfg);
  ModelOptions o;
  o.image_size = image;
  o.num_classes = 10;
  o.aux_logits = false;
  build_model(*g, k, o);
  g->plan();
  init_parameters(*g, 11);
  const auto img = test::random_vec(static_cast<std::size_t>(batch * 3 * image * image), 21);
  const std::vector<float> f32(img.begin(), img.end());
  g->set_input_nchw(f32.data());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i * 3 % 10);
  g->set_labels(labels.data());
  return g;
}

// ResNet-50: in every bottleneck conv1's and conv2's outputs feed only the next convolution, conv3's
// and the downsample's only the residual add, so all 52 of them are loaded through their batch norm;
// the stem's feeds the max pool and stays stored. The block inputs (the adds' outputs) are stored.
TEST(Fuse, ResNet50FusesEveryUnitButTheStem) {
  auto be = make_cpu_backend();
  auto g = model(*be, ModelKind::resnet50, 32, Layout::nhwc, DType::f32, Fuse::on);
  int unstored = 0, conv_loads = 0, add_loads = 0;
  for (const auto& l : g->layers()) {
    SCOPED_TRACE(l.label);
    if (l.is_conv_bn()) {
      unstored += !l.stored;
      EXPECT_EQ(l.stored, l.label == "conv1");
      ASSERT_EQ(l.loads.size(), 1u);
      const bool first = l.label.find(".conv1") != std::string::npos || l.label.find("downsample") != std::string::npos;
      EXPECT_EQ(l.loads[0].empty(), first || l.label == "conv1");
      if (l.label.find(".conv2") != std::string::npos) {
        EXPECT_EQ(l.loads[0], l.label.substr(0, l.label.size() - 1) + "1");
      }
      conv_loads += !l.loads[0].empty();
      EXPECT_FALSE(l.fused.empty());
    }
    if (l.kind == "add_relu") {
      ASSERT_EQ(l.loads.size(), 2u);
      EXPECT_EQ(l.loads[0], l.label.substr(0, l.label.size() - 8) + "conv3");  // "<block>.add_relu"
      add_loads += !l.loads[0].empty() + !l.loads[1].empty();
    }
  }
  EXPECT_EQ(unstored, 52);
  EXPECT_EQ(conv_loads, 32);     // conv2 and conv3 of 16 blocks
  EXPECT_EQ(add_loads, 16 + 4);  // every conv3, and the 4 downsamples
  // off: nothing fused, every output stored
  auto off = model(*be, ModelKind::resnet50, 32, Layout::nhwc, DType::f32, Fuse::off);
  for (const auto& l : off->layers()) {
    EXPECT_TRUE(l.stored);
    EXPECT_TRUE(l.fused.empty());
    for (const auto& from : l.loads) EXPECT_TRUE(from.empty());
  }
}

// Inception-v3 (counted by hand from torchvision's modules): the stem's Conv2d_1a, 2a and 3b, and
// inside the blocks every unit that feeds only convolutions of its branch: 3 in each Mixed_5
// (branch5x5_1, branch3x3dbl_1 and _2), 2 in Mixed_6a, 6 in each Mixed_6b-e (branch7x7_1, _2,
// branch7x7dbl_1 to _4), 4 in Mixed_7a (branch3x3_1, branch7x7x3_1 to _3), 3 in each Mixed_7b, c
// (branch3x3_1, branch3x3dbl_1, _2: the 1x3/3x1 pairs read them): 3 + 9 + 2 + 24 + 4 + 6 = 48.
// Every branch's last unit writes its concat's slice and is stored.
TEST(Fuse, InceptionV3FusesTheUnitsInsideItsBranches) {
  auto be = make_cpu_backend();
  auto g = model(*be, ModelKind::inception_v3, 75, Layout::nhwc, DType::f32, Fuse::on, Recompute::automatic, 1);
  std::vector<std::string> unstored;
  for (const auto& l : g->layers())
    if (l.is_conv_bn() && !l.stored) unstored.push_back(l.label);
  EXPECT_EQ(unstored.size(), 48u) << fmt::format("{}", fmt::join(unstored, ", "));
  for (const char* name : {"Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_3b_1x1", "Mixed_5b.branch3x3dbl_2",
                           "Mixed_6e.branch7x7dbl_4", "Mixed_7c.branch3x3_1"})
    EXPECT_NE(std::find(unstored.begin(), unstored.end(), name), unstored.end()) << name;
  for (const char* name : {"Conv2d_2b_3x3", "Conv2d_4a_3x3", "Mixed_5b.branch1x1", "Mixed_7c.branch3x3_2a"})
    EXPECT_EQ(std::find(unstored.begin(), unstored.end(), name), unstored.end()) << name;
}

// What fusing frees: the unstored outputs. With nothing recomputed unfused, a unit's output is saved
// for backward where backward reads it (the ReLU's mask, the next convolution's filter gradient);
// fused, the saved buffers are the same but for exactly those outputs (each unit's z and statistics
// are saved either way), the plan has no buffer at all for an unstored output, and it stays sound.
TEST(Fuse, UnstoredOutputsLeaveThePlan) {
  auto be = make_cpu_backend();
  for (ModelKind k : {ModelKind::resnet50, ModelKind::inception_v3}) {
    SCOPED_TRACE(to_string(k));
    const std::int64_t image = k == ModelKind::resnet50 ? 64 : 75;
    auto off = model(*be, k, image, Layout::nhwc, DType::f32, Fuse::off, Recompute::off);
    auto on = model(*be, k, image, Layout::nhwc, DType::f32, Fuse::on, Recompute::off);
    auto buffers = [](const Graph& g, bool saved_only) {
      std::map<std::string, std::size_t> b;
      for (const auto& pb : g.memory_plan().buffers)  // not the composed units' empty statistics and factors
        if ((!saved_only || pb.kind == BufferKind::saved) && pb.bytes > 0) b[pb.name] = pb.bytes;
      return b;
    };
    const auto a = buffers(*off, true), b = buffers(*on, true), all_off = buffers(*off, false),
               all_on = buffers(*on, false);
    std::size_t freed = 0, unstored = 0, were_saved = 0;
    for (const auto& l : on->layers())
      if (l.is_conv_bn() && !l.stored) {
        ++unstored;
        const std::string name = l.label + " output";
        ASSERT_TRUE(all_off.count(name)) << name << " is in the unfused plan";
        EXPECT_FALSE(all_on.count(name)) << name << " is in the fused plan";
        if (a.count(name)) freed += a.at(name), ++were_saved;
      }
    ASSERT_GT(were_saved, 0u);
    ASSERT_GE(unstored, were_saved);
    std::size_t total_a = 0, total_b = 0;
    for (const auto& [name, bytes] : a) total_a += bytes;
    for (const auto& [name, bytes] : b) {
      total_b += bytes;
      EXPECT_TRUE(a.count(name)) << name << " saved only when fused";
    }
    EXPECT_EQ(total_a - total_b, freed);
    EXPECT_LT(on->device_bytes(), off->device_bytes());
    EXPECT_TRUE(plan_conflicts(on->memory_plan()).empty());
  }
}

// Values that must stay readable are stored even where every reader could load them: one kept with
// keep(); and with every value kept (BufferSharing::keep_values) nothing is fused at all.
TEST(Fuse, KeptValuesStayStoredAndKeptSharingFusesNothing) {
  auto be = make_cpu_backend();
  for (const bool keep : {false, true})
    for (const BufferSharing sharing : {BufferSharing::by_liveness, BufferSharing::keep_values}) {
      SCOPED_TRACE(
          fmt::format("keep {}, sharing {}", keep, sharing == BufferSharing::by_liveness ? "by liveness" : "keep"));
      GraphConfig cfg{2, Layout::nhwc, DType::f32, 1};
      cfg.fuse = Fuse::on;
      cfg.sharing = sharing;
      Graph g(*be, cfg);
      const ValueId x = g.input(3, 8, 8);
      const ValueId a = g.conv_bn_relu("a", x, 4, {1, 1});
      const ValueId b = g.conv_bn_relu("b", a, 4, {3, 3, 1, 1, 1, 1});
      g.cross_entropy(g.linear("fc", g.global_avg_pool(b), 3), 1.0f, "logits");
      if (keep) g.keep(a);
      g.plan();
      const bool fused = sharing == BufferSharing::by_liveness;
      for (const auto& l : g.layers()) {
        if (!l.is_conv_bn()) continue;
        EXPECT_EQ(l.fused.empty(), !fused) << l.label;
        EXPECT_EQ(l.stored, l.label != "a" || keep || !fused) << l.label;
        const std::string loads = l.label == "b" && !keep && fused ? "a" : "";
        EXPECT_EQ(l.loads, std::vector<std::string>{loads}) << l.label;
      }
    }
}

struct Step {
  float loss = 0;
  std::vector<float> logits, eval_logits, state;
  std::map<std::string, test::Vec> grads;
};
// One training step, then an inference forward with the running statistics it left.
Step fused_or_not_step(Graph& g) {
  auto& s = g.backend().default_stream();
  Step r;
  g.forward(s, true);
  r.loss = g.loss(s);
  r.logits = g.read_output("logits");
  g.backward(s);
  r.grads = test::graph_grads(g);
  r.state.resize(g.state_arena_floats());
  g.backend().copy(s, r.state.data(), g.state_arena(), r.state.size() * sizeof(float));
  g.backend().synchronize(s);
  g.forward(s, false);
  r.eval_logits = g.read_output("logits");
  return r;
}

// The fused step against the unfused one on the same numbers (batch norms' scales and shifts off
// their initial values). On the cpu backend the composed
// pieces run the unfused kernels on the same inputs (the batch norm's recompute gives its training
// forward's bits), so the two agree bit for bit: the loss, the logits, every gradient, the running
// statistics and the inference logits. A fault in the fused path (a load without the ReLU, without
// the scale, a statistic short of an element) changes them.
class FuseSteps : public testing::TestWithParam<test::Config> {};
TEST_P(FuseSteps, FusedStepIsTheUnfusedStep) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& c = GetParam();
  struct Case {
    ModelKind k;
    std::int64_t image;
    Recompute r;
  };
  // (Inception-v3 without recompute, fp32, with every dead byte poisoned: LivenessOfRealModels' FusedModels)
  for (const Case& cs : {Case{ModelKind::resnet50, 32, Recompute::on}, Case{ModelKind::resnet50, 32, Recompute::off},
                         Case{ModelKind::inception_v3, 75, Recompute::on}}) {
    SCOPED_TRACE(fmt::format("{} {}x{}, recompute {}", to_string(cs.k), cs.image, cs.image, to_string(cs.r)));
    auto off = model(*be, cs.k, cs.image, c.layout, c.dtype, Fuse::off, cs.r);
    auto on = model(*be, cs.k, cs.image, c.layout, c.dtype, Fuse::on, cs.r);
    test::perturb_batch_norms(*off, 50);  // so that a load ignoring the scale or the shift would show
    test::perturb_batch_norms(*on, 50);
    const Step a = fused_or_not_step(*off), b = fused_or_not_step(*on);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.logits, b.logits);
    EXPECT_EQ(a.state, b.state);
    EXPECT_EQ(a.eval_logits, b.eval_logits);
    ASSERT_EQ(a.grads.size(), b.grads.size());
    int differ = 0;
    for (const auto& [name, ga] : a.grads) differ += ga != b.grads.at(name);
    EXPECT_EQ(differ, 0) << "of " << a.grads.size() << " gradients";
  }
}
std::vector<test::Config> cpu_configs() {
  std::vector<test::Config> v;
  for (const auto& c : test::all_configs())
    if (c.backend == "cpu") v.push_back(c);
  return v;
}
INSTANTIATE_TEST_SUITE_P(Cpu, FuseSteps, testing::ValuesIn(cpu_configs()), test::config_name);

}  // namespace
}  // namespace stepbench
