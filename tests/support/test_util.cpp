#include "support/test_util.hpp"

#include <map>
#include <set>

#include "graph/graph.hpp"

namespace stepbench::test {
namespace {
ParamEntry filter_entry(const Backend& be, Layout l, std::int64_t O, std::int64_t I, std::int64_t KH, std::int64_t KW) {
  ParamEntry e{"w", {O, I, KH, KW}};
  e.count = static_cast<std::size_t>(O * I * KH * KW);
  e.is_filter = true;
  e.format = be.filter_format(l);
  return e;
}
}  // namespace

std::vector<double> filter_for(const Backend& be, Layout l, const std::vector<double>& oihw, std::int64_t O,
                               std::int64_t I, std::int64_t KH, std::int64_t KW) {
  const auto e = filter_entry(be, l, O, I, KH, KW);
  std::vector<float> src(oihw.begin(), oihw.end()), dst(src.size());
  filter_to_storage(src.data(), dst.data(), e);
  return {dst.begin(), dst.end()};
}

std::vector<double> filter_back(const Backend& be, Layout l, const std::vector<double>& stored, std::int64_t O,
                                std::int64_t I, std::int64_t KH, std::int64_t KW) {
  const auto e = filter_entry(be, l, O, I, KH, KW);
  std::vector<float> src(stored.begin(), stored.end()), dst(src.size());
  filter_from_storage(src.data(), dst.data(), e);
  return {dst.begin(), dst.end()};
}

std::vector<double> read_filter(Backend& be, const float* p, const ParamEntry& e) {
  std::vector<float> stored(e.count), out(e.numel());
  be.copy(be.default_stream(), stored.data(), p, stored.size() * sizeof(float));
  be.synchronize(be.default_stream());
  filter_from_storage(stored.data(), out.data(), e);
  return {out.begin(), out.end()};
}

std::vector<double> read_nchw(Backend& be, const Tensor& t) {
  const Shape& s = t.shape();
  const std::int64_t extent = t.desc.offset(s.n - 1, s.c - 1, s.h - 1, s.w - 1) + 1;
  std::vector<char> stored(static_cast<std::size_t>(extent) * dtype_size(t.desc.dtype));
  be.copy(be.default_stream(), stored.data(), t.data, stored.size());
  be.synchronize(be.default_stream());
  std::vector<float> host(static_cast<std::size_t>(extent));
  convert(stored.data(), t.desc.dtype, host.data(), DType::f32, host.size());
  std::vector<double> out(static_cast<std::size_t>(s.numel()));
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w)
          out[ref::idx(s, n, c, h, w)] = host[static_cast<std::size_t>(t.desc.offset(n, c, h, w))];
  return out;
}

namespace {
std::vector<double> read_floats(Backend& be, const float* p, std::size_t n) {
  std::vector<float> h(n);
  be.copy(be.default_stream(), h.data(), p, n * 4);
  be.synchronize(be.default_stream());
  return {h.begin(), h.end()};
}
}  // namespace

void perturb_batch_norms(Graph& g, std::uint32_t seed) {
  Backend& be = g.backend();
  for (const auto& l : g.layers())
    for (const bool scale : {true, false})
      if (l.is_conv_bn()) {
        const ParamEntry& e = g.param(l.bn + (scale ? ".weight" : ".bias"));
        const auto v = random_vec(e.numel(), ++seed, scale ? 0.5 : -0.5, scale ? 1.5 : 0.5);
        const std::vector<float> f(v.begin(), v.end());
        be.copy(be.default_stream(), g.data_of(e), f.data(), f.size() * sizeof(float));
        be.synchronize(be.default_stream());
      }
}

void expect_units_match_oracle(Graph& g, const ErrorModel& model, const std::function<bool(const LayerInfo&)>& only) {
  ASSERT_NE(g.config().sharing, BufferSharing::by_liveness)
      << "the values and gradients inside the net are read after the step: plan with GraphConfig::sharing = "
         "keep_values";
  Backend& be = g.backend();
  // A 16-bit graph convolves 16-bit copies of its fp32 master weights (read here, then rounded to
  // the copies' values, round to nearest as the cast kernel does).
  const ErrorModel& m = model;
  const DType t = g.config().dtype;
  int checked = 0;
  // The gradient each consumed value should hold: the sum over its consumers of what each one's
  // backward sends it, recomputed by the oracle from the gradient at the consumer's output, with
  // the bound of each contribution's error.
  std::map<ValueId, ref::Vec> want, bound;
  std::set<ValueId> unknown;  // a consumer the oracle does not model here (dropout)
  auto add_to = [&](ValueId v, const ref::Vec& d, const ref::Vec& e) {
    auto& w = want[v];
    auto& b = bound[v];
    if (w.empty()) {
      w.assign(d.size(), 0.0);
      b.assign(d.size(), 0.0);
    }
    for (std::size_t i = 0; i < d.size(); ++i) {
      w[i] += d[i];
      b[i] += e[i] + (m.u_acc + m.u_out) * std::abs(w[i]);  // the accumulation, stored
    }
  };
  for (const auto& u : g.layers()) {
    if (only && !only(u)) {
      for (ValueId v : u.in) unknown.insert(v);
      continue;
    }
    if (u.kind == "pool") {
      const Tensor xt = g.value(u.in[0]), yt = g.value(u.out);
      const auto x = read_nchw(be, xt), dy = read_nchw(be, g.grad(u.out));
      ref::Vec dx;
      ref::pool_backward(xt.shape(), x, yt.shape(), dy, dx, u.pool);
      add_to(u.in[0], dx, pool_backward_bound(xt.shape(), x, yt.shape(), dy, dx, u.pool, m));
      continue;
    }
    if (u.kind == "linear") {
      const Tensor xt = g.value(u.in[0]), yt = g.value(u.out);
      const auto& we = g.param(u.name + ".weight");
      const std::int64_t N = xt.shape().n, K = xt.shape().c, M = yt.shape().c;
      const auto x = read_nchw(be, xt), w = round_to(t, read_floats(be, g.data_of(we), we.count)),
                 dy = read_nchw(be, g.grad(u.out));
      ref::Vec dx, dw, db, adx, adw, adb;
      ref::linear_backward(N, K, M, x, w, dy, dx, dw, db);
      ref::linear_backward(N, K, M, absv(x), absv(w), absv(dy), adx, adw, adb);
      add_to(u.in[0], dx, plus_rounding(axpby(m.sum(M), adx, 0, {}), dx, m.u_out));
      continue;
    }
    if (u.kind == "add_relu") {  // the masked gradient, as it is, to both inputs
      const auto y = read_nchw(be, g.value(u.out)), dy = read_nchw(be, g.grad(u.out));
      ref::Vec dx;
      ref::add_relu_backward(y, dy, dx);
      for (ValueId v : u.in)
        if (v != g.layers().front().in[0]) add_to(v, dx, ref::Vec(dx.size(), 0.0));
      continue;
    }
    if (!u.is_conv_bn()) {
      if (u.kind != "cross_entropy") unknown.insert(u.in[0]);
      continue;
    }
    SCOPED_TRACE(u.name);
    const Tensor xt = g.value(u.in[0]), yt = g.value(u.out), dyt = g.grad(u.out);
    const Shape xs = xt.shape(), ys = yt.shape();
    const bool relu = u.kind == "conv_bn_relu";
    const auto& we = g.param(u.weight);
    const auto& ge = g.param(u.bn + ".weight");
    const auto& be_ = g.param(u.bn + ".bias");
    const auto w = round_to(t, read_filter(be, g.data_of(we), we));
    const auto gamma = read_floats(be, g.data_of(ge), ge.count), beta = read_floats(be, g.data_of(be_), be_.count);
    const auto x = read_nchw(be, xt), y = read_nchw(be, yt), dy = read_nchw(be, dyt);
    ref::Vec z, y_ref, dz, dgamma, dbeta, dw, dx;
    ref::BnSaved saved;
    ref::conv_forward(xs, x, w, ys, z, u.conv);
    ref::bn_forward_training(ys, z, gamma, beta, u.bn_eps, relu, y_ref, saved);
    ref::bn_backward(ys, z, y_ref, dy, gamma, saved, relu, dz, dgamma, dbeta);
    // z carries the convolution's error into batch norm, dz carries batch norm's into the filter
    // gradient and the input gradient
    const auto ez =
        conv_forward_bound(xs, x, {}, w, ys, z, u.conv, for_conv(m, u.conv_algorithm, ConvDirection::forward));
    const auto eb = bn_bounds(ys, z, ez, gamma, beta, u.bn_eps, relu, dy, saved, m);
    EXPECT_WITHIN(y, y_ref, eb.y);
    ref::conv_backward_filter(xs, x, ys, dz, dw, u.conv);
    EXPECT_WITHIN(read_filter(be, g.grad_of(we), we), dw,
                  conv_backward_filter_bound(xs, x, ys, dz, eb.dx, dw, u.conv,
                                             for_conv(m, u.conv_algorithm, ConvDirection::backward_filter)));
    EXPECT_WITHIN(read_floats(be, g.grad_of(ge), ge.count), dgamma, eb.dgamma);
    EXPECT_WITHIN(read_floats(be, g.grad_of(be_), be_.count), dbeta, eb.dbeta);
    if (u.in[0] != g.layers().front().in[0]) {  // the input image has no gradient
      ref::conv_backward_data(ys, dz, w, xs, dx, u.conv);
      add_to(u.in[0], dx,
             conv_backward_data_bound(ys, dz, eb.dx, w, xs, dx, u.conv,
                                      for_conv(m, u.conv_algorithm, ConvDirection::backward_data)));
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
  int values = 0;
  for (const auto& [v, d] : want) {
    if (unknown.count(v)) continue;
    SCOPED_TRACE("gradient of value " + std::to_string(v));
    EXPECT_WITHIN(read_nchw(be, g.grad(v)), d, bound.at(v));
    ++values;
  }
  EXPECT_GT(values, 0);
}

}  // namespace stepbench::test
