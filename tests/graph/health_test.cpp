// Where a step's numbers first stop being finite (Graph::parameters_finite, first_non_finite):
// planted NaNs in a parameter, a running statistic and the input are each found where they are, also
// at a fused unit whose output is not stored (GraphConfig::fuse: the check makes it from its z).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/registry.hpp"
#include "graph/graph.hpp"
#include "models/models.hpp"

namespace stepbench {
namespace {

GraphConfig tiny_config(Fuse f) {
  GraphConfig c{4, Layout::nchw, DType::f32, 1};
  c.fuse = f;
  return c;
}

struct Tiny {
  std::unique_ptr<Backend> be = make_backend(BackendKind::cpu);
  Graph g;
  explicit Tiny(Fuse f = Fuse::off) : g(*be, tiny_config(f)) {
    ModelOptions o;
    o.image_size = 32;
    build_model(g, ModelKind::tiny, o);
    g.plan();
    init_parameters(g, 5);
    std::vector<float> x(4 * 3 * 32 * 32);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
    g.set_input_nchw(x.data());
    const std::int32_t labels[4] = {0, 1, 2, 3};
    g.set_labels(labels);
  }
  Stream& s() { return be->default_stream(); }
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(Health, AFiniteStepHasNothingToReport) {
  Tiny t;
  EXPECT_TRUE(t.g.parameters_finite(t.s()));
  EXPECT_EQ(t.g.first_non_finite(t.s()), "");
}

TEST(Health, ANonFiniteParameterIsNamed) {
  Tiny t;
  std::vector<const ParamEntry*> trainable;
  for (const auto& e : t.g.params())
    if (e.trainable) trainable.push_back(&e);
  ASSERT_GT(trainable.size(), 4u);
  const ParamEntry& p = *trainable[4];  // not the first: the report names the one planted
  t.g.data_of(p)[p.count / 2] = kNaN;   // the cpu backend's arenas are host memory
  EXPECT_FALSE(t.g.parameters_finite(t.s()));
  EXPECT_EQ(t.g.first_non_finite(t.s()), "the parameter " + p.name + " (an update wrote it)");
}

TEST(Health, ARunningStatisticBreaksOnlyTheInferenceForwardAtItsLayer) {
  for (Fuse f : {Fuse::off, Fuse::on}) {
    SCOPED_TRACE(to_string(f));
    Tiny t(f);
    // a unit past the first; fused, one whose output is not stored
    std::string layer;
    for (const auto& l : t.g.layers())
      if (l.is_conv_bn() && l.label != "conv1" && layer.empty() && (f == Fuse::off || !l.stored)) layer = l.label;
    ASSERT_FALSE(layer.empty());
    const ParamEntry& var = t.g.param(layer + ".bn.running_var");
    t.g.data_of(var)[0] = -1.0f;                // 1 / sqrt(-1 + eps): NaN in that unit's inference output
    EXPECT_TRUE(t.g.parameters_finite(t.s()));  // not a trainable parameter
    EXPECT_EQ(t.g.first_non_finite(t.s()), "the output of " + layer + " (conv_bn_relu) in the inference forward");
  }
}

TEST(Health, ANonFiniteInputIsFoundAtTheFirstLayer) {
  for (Fuse f : {Fuse::off, Fuse::on}) {
    SCOPED_TRACE(to_string(f));
    Tiny t(f);
    bool first_unstored = false;
    for (const auto& l : t.g.layers()) first_unstored = first_unstored || (l.label == "conv1" && !l.stored);
    EXPECT_EQ(first_unstored, f == Fuse::on) << "tiny's first unit feeds only convolutions";
    std::vector<float> x(4 * 3 * 32 * 32, 0.5f);
    x[100] = std::numeric_limits<float>::infinity();
    t.g.set_input_nchw(x.data());
    const std::string where = t.g.first_non_finite(t.s());
    EXPECT_NE(where.find("the output of conv1 (conv_bn_relu) in the inference forward"), std::string::npos) << where;
  }
}

}  // namespace
}  // namespace stepbench
