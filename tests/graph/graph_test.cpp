// The graph: planning (arenas, concat slices, fan-out accumulation) and finite-difference gradient
// checks of a small conv-BN-ReLU-pool-concat-FC-loss network.
#include <algorithm>
#include <numeric>

#include "graph/graph.hpp"
#include "models/models.hpp"
#include "support/test_util.hpp"

namespace stepbench {
namespace {

class GraphTest : public testing::TestWithParam<test::Config> {};

// input -> unit -> fan-out into three branches (1x1 conv, 3x3 conv, 3x3 max pool) -> concat ->
// avg pool 3 s2 -> 1x1 conv -> global average pool -> FC -> softmax cross-entropy
struct SmallNet {
  struct Unit {
    std::string name;
    ValueId in, out;
    ConvParams p;
  };
  std::unique_ptr<Graph> g;
  ValueId x, stem, cat;
  std::vector<Unit> units;
  ValueId unit(const std::string& name, ValueId in, std::int64_t cout, ConvParams p) {
    const ValueId out = g->conv_bn_relu(name, in, cout, p);
    units.push_back({name, in, out, p});
    return out;
  }
  SmallNet(Backend& be, Layout l, DType t, bool block_e = false) {
    g = std::make_unique<Graph>(be, GraphConfig{3, l, t, 7});
    x = g->input(3, 10, 10);
    stem = unit("stem", x, 4, {3, 3, 1, 1, 1, 1});
    if (block_e) {  // Inception's block E: a value fans out into 1x3 and 3x1, all concatenated
      auto b1 = unit("b1", stem, 2, {1, 1});
      auto b3 = unit("b3", stem, 3, {1, 1});
      auto b3a = unit("b3a", b3, 2, {1, 3, 1, 1, 0, 1});
      auto b3b = unit("b3b", b3, 2, {3, 1, 1, 1, 1, 0});
      auto bp = unit("bp", g->pool(stem, {PoolKind::avg_include_pad, 3, 3, 1, 1, 1, 1}), 2, {1, 1});
      stem = g->concat({b1, b3a, b3b, bp});
    }
    auto a = unit("a", stem, 3, {1, 1});
    auto b = unit("b", stem, 2, {3, 3, 1, 1, 1, 1});
    auto c = g->pool(stem, {PoolKind::max, 3, 3, 1, 1, 1, 1});
    cat = g->concat({a, b, c});
    auto p = g->pool(cat, {PoolKind::avg_include_pad, 3, 3, 2, 2, 0, 0});
    auto d = unit("d", p, 6, {1, 1});
    auto f = g->linear("fc", g->global_avg_pool(d), 5);
    g->cross_entropy(f, 1.0f, "logits");
    g->plan();
    init_parameters(*g, 1234);
    std::vector<float> img(3 * 3 * 10 * 10);
    auto v = test::random_vec(img.size(), 99);
    std::copy(v.begin(), v.end(), img.begin());
    // the input is NCHW on the host; place it in the graph's layout
    test::DevTensor tmp(be, {3, 3, 10, 10}, l, t);
    tmp.upload(v);
    be.copy(be.default_stream(), g->input_tensor().data, tmp.t().data, g->input_tensor().desc.bytes());
    const std::int32_t labels[3] = {1, 4, 0};
    be.copy(be.default_stream(), g->labels(), labels, sizeof labels);
  }
  double loss() {
    auto& s = g->backend().default_stream();
    g->forward(s, true);
    return g->loss(s);
  }
};

std::vector<double> read(Backend& be, const float* p, std::size_t n) {
  std::vector<float> h(n);
  be.copy(be.default_stream(), h.data(), p, n * 4);
  be.synchronize(be.default_stream());
  return {h.begin(), h.end()};
}
void write(Backend& be, float* p, const std::vector<double>& v) {
  std::vector<float> h(v.begin(), v.end());
  be.copy(be.default_stream(), p, h.data(), h.size() * 4);
  be.synchronize(be.default_stream());
}

// Finite differences through the whole small network. (With a block-E topology in front the fp32
// loss is too rough for finite differences: the numeric slope moves by 10% between h = 1e-2, 1e-3
// and 3e-4 as ReLU masks and pooling choices flip, so that network is checked layer by layer
// against the oracle instead: UnitGradientsMatchTheOracleInPlaceWithBlockE.)
TEST_P(GraphTest, GradientsMatchFiniteDifferences) {
  const test::Config& cfg = GetParam();
  SB_BACKEND_OR_SKIP(be, cfg);
  if (cfg.dtype != DType::f32 || cfg.tf32) GTEST_SKIP() << "finite differences need fp32 math";
  SmallNet net(*be, cfg.layout, cfg.dtype);
  auto& s = be->default_stream();
  net.loss();
  net.g->backward(s);
  // Directional derivative per parameter tensor: (L(p + h v) - L(p - h v)) / 2h against <grad, v>.
  // A random direction averages over ReLU and max-pool kinks, which a coordinate check can hit.
  for (const auto& e : net.g->params()) {
    if (!e.trainable) continue;
    SCOPED_TRACE(e.name);
    const auto p0 = read(*be, net.g->data_of(e), e.count);
    const auto grad = read(*be, net.g->grad_of(e), e.count);
    auto v = test::random_vec(e.count, static_cast<std::uint32_t>(e.offset + 1));
    double norm = 0;
    for (double d : v) norm += d * d;
    for (double& d : v) d /= std::sqrt(norm);
    double analytic = 0;
    for (std::size_t i = 0; i < e.count; ++i) analytic += grad[i] * v[i];
    const double h = 1e-2;
    auto shifted = [&](double sgn) {
      std::vector<double> p(p0);
      for (std::size_t i = 0; i < p.size(); ++i) p[i] += sgn * h * v[i];
      write(*be, net.g->data_of(e), p);
      return net.loss();
    };
    const double numeric = (shifted(1) - shifted(-1)) / (2 * h);
    write(*be, net.g->data_of(e), p0);
    EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric))
        << "analytic " << analytic << " numeric " << numeric;
  }
}

// Each conv-BN-ReLU unit inside the graph, checked locally against the oracle: from the unit's
// input value and the gradient arriving at its output (both read back from the graph after
// backward), the oracle recomputes the forward and the weight, gamma and beta gradients.
void check_units(const test::Config& cfg, bool with_block_e) {
  std::string sb_why_;
  auto be = test::try_backend(cfg, sb_why_);
  if (!be) GTEST_SKIP() << sb_why_;
  SmallNet net(*be, cfg.layout, cfg.dtype, with_block_e);
  net.loss();
  net.g->backward(be->default_stream());
  test::expect_units_match_oracle(*net.g, test::error_model(cfg));
}
TEST_P(GraphTest, UnitGradientsMatchTheOracleInPlace) { check_units(GetParam(), false); }
TEST_P(GraphTest, UnitGradientsMatchTheOracleInPlaceWithBlockE) { check_units(GetParam(), true); }

TEST_P(GraphTest, FanOutGradientIsTheSumOfTheBranches) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  // u feeds two identity pools (1x1 average) whose outputs are concatenated, then a third branch
  // (a 1x1 conv) feeds the loss too. grad(u) must be slice 0 + slice 1 of grad(cat) + the conv's.
  Graph g(*be, GraphConfig{2, GetParam().layout, GetParam().dtype, 1});
  auto x = g.input(3, 6, 6);
  auto u = g.conv_bn_relu("u", x, 4, {3, 3, 1, 1, 1, 1});
  const PoolParams identity{PoolKind::avg_include_pad, 1, 1, 1, 1, 0, 0};
  auto a = g.pool(u, identity);
  auto b = g.pool(u, identity);
  auto cat = g.concat({a, b});
  auto f = g.linear("fc", g.global_avg_pool(cat), 3);
  g.cross_entropy(f, 1.0f, "logits");
  g.plan();
  init_parameters(g, 5);
  test::DevTensor in(*be, {2, 3, 6, 6}, GetParam().layout, GetParam().dtype);  // the graph's input type
  in.upload(test::random_vec(2 * 3 * 36, 4));
  auto& s = be->default_stream();
  be->copy(s, g.input_tensor().data, in.t().data, g.input_tensor().desc.bytes());
  g.forward(s, true);
  g.backward(s);
  const Shape us = g.value(u).shape();
  test::DevTensor du(*be, us, GetParam().layout, GetParam().dtype),
      dcat(*be, {2, 8, 6, 6}, GetParam().layout, GetParam().dtype);
  be->copy(s, const_cast<void*>(du.t().data), g.grad(u).data, g.grad(u).desc.bytes());
  be->copy(s, const_cast<void*>(dcat.t().data), g.grad(cat).data, g.grad(cat).desc.bytes());
  const auto gu = du.download(), gc = dcat.download();
  std::vector<double> want(gu.size());
  for (std::int64_t n = 0; n < us.n; ++n)
    for (std::int64_t c = 0; c < us.c; ++c)
      for (std::int64_t h = 0; h < us.h; ++h)
        for (std::int64_t w = 0; w < us.w; ++w)
          want[ref::idx(us, n, c, h, w)] =
              gc[ref::idx({2, 8, 6, 6}, n, c, h, w)] + gc[ref::idx({2, 8, 6, 6}, n, c + 4, h, w)];
  // the identity pools copy their gradient (stored in the dtype); the fan-out adds two of them
  const auto m = test::error_model(GetParam());
  ref::Vec bound(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) bound[i] = (m.u_acc + 2 * m.u_out) * 2 * std::abs(want[i]) + 1e-30;
  EXPECT_WITHIN(gu, want, bound);
  double norm = 0;
  for (double v : want) norm += v * v;
  EXPECT_GT(norm, 0.0);
}

TEST_P(GraphTest, ArenasAreContiguousInReverseExecutionOrder) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  SmallNet net(*be, GetParam().layout, GetParam().dtype);
  std::size_t expected_params = 0;
  const ParamEntry* prev = nullptr;
  for (const auto& e : net.g->params()) {
    if (!e.trainable) continue;
    expected_params += e.count;
    if (prev) {
      EXPECT_LT(e.offset, prev->offset) << e.name << " should sit before " << prev->name;
    }
    EXPECT_EQ(e.offset % 16, 0u) << e.name;
    prev = &e;
  }
  EXPECT_EQ(net.g->num_parameters(), static_cast<std::int64_t>(expected_params));
  EXPECT_EQ(net.g->param("fc.bias").offset, 0u);  // the last layer's parameters come first
  EXPECT_GE(net.g->param_arena_floats(), expected_params);
  EXPECT_LT(net.g->param_arena_floats(), expected_params + 16 * net.g->params().size());
  EXPECT_THROW(net.g->param("nope"), Error);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, GraphTest, testing::ValuesIn(test::all_configs()), test::config_name);

TEST(Graph, LayoutsAgree) {
  auto be = make_cpu_backend();
  SmallNet a(*be, Layout::nchw, DType::f32), b(*be, Layout::nhwc, DType::f32);
  const double la = a.loss(), lb = b.loss();
  EXPECT_NEAR(la, lb, 1e-5 * std::abs(la));
  a.g->backward(be->default_stream());
  b.g->backward(be->default_stream());
  for (const auto& e : a.g->params()) {
    if (!e.trainable) continue;
    SCOPED_TRACE(e.name);
    const auto& eb = b.g->param(e.name);
    std::vector<float> ga(e.count), gb(e.count);
    filter_from_storage(a.g->grad_of(e), ga.data(), e);
    filter_from_storage(b.g->grad_of(eb), gb.data(), eb);
    EXPECT_CLOSE(std::vector<double>(ga.begin(), ga.end()), std::vector<double>(gb.begin(), gb.end()), 1e-4);
  }
}

TEST(Graph, BadConfigurationsAreClearErrors) {
  auto be = make_cpu_backend();
  EXPECT_THROW(Graph(*be, GraphConfig{0}), UsageError);
  Graph g(*be, GraphConfig{2});
  auto x = g.input(3, 5, 5);
  EXPECT_THROW(g.conv_bn_relu("c", x, 4, {7, 7}), UsageError);  // kernel larger than the input
  EXPECT_THROW(g.linear("fc", x, 3), Error);                    // linear needs pooled input
}

// Everything a planned graph holds lives in one arena: the parameter, gradient and state arenas
// and every activation, gradient and workspace buffer are inside it, and none overlap.
TEST(Graph, OneArenaHoldsEveryBuffer) {
  auto be = make_cpu_backend();
  Graph g(*be, GraphConfig{4, Layout::nhwc});
  ModelOptions o;
  o.image_size = 24;
  o.num_classes = 10;
  build_tiny(g, o);
  g.plan();
  const std::size_t params = g.param_arena_floats() * sizeof(float);
  EXPECT_GE(g.device_bytes(), g.activation_bytes() + 2 * params);
  const char* lo = reinterpret_cast<const char*>(g.param_arena());
  const char* hi = lo + g.device_bytes();
  std::vector<std::pair<const char*, std::size_t>> spans = {
      {reinterpret_cast<const char*>(g.param_arena()), params},
      {reinterpret_cast<const char*>(g.grad_arena()), params},
      {reinterpret_cast<const char*>(g.state_arena()), g.state_arena_floats() * sizeof(float)},
      {static_cast<const char*>(g.input_tensor().data), g.input_tensor().desc.bytes()},
      {static_cast<const char*>(g.output("logits").data), g.output("logits").desc.bytes()}};
  for (auto [p, n] : spans) {
    EXPECT_GE(p, lo);
    EXPECT_LE(p + n, hi);
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first);
}

}  // namespace
}  // namespace stepbench
namespace stepbench {
namespace {
TEST(Graph, BackwardLeavesForwardValuesIntact) {
  auto be = make_cpu_backend();
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    SmallNet net(*be, l, DType::f32, true);
    net.loss();
    // Dense values only: concat parts are slices, covered by their (dense) root.
    auto contents = [](const Tensor& t) { return std::vector<float>(t.as<float>(), t.as<float>() + t.desc.numel()); };
    std::vector<std::vector<float>> before;
    for (ValueId v = 0;; ++v) {
      Tensor t;
      try {
        t = net.g->value(v);
      } catch (const std::out_of_range&) {
        break;
      }
      before.push_back(t.desc.is_dense() ? contents(t) : std::vector<float>{});
    }
    net.g->backward(be->default_stream());
    for (ValueId v = 0; v < static_cast<ValueId>(before.size()); ++v) {
      const Tensor t = net.g->value(v);
      if (!t.desc.is_dense()) continue;
      EXPECT_EQ(before[v], contents(t)) << "value " << v << " changed during backward";
    }
  }
}
}  // namespace
}  // namespace stepbench
