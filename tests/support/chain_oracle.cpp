#include "support/chain_oracle.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <utility>

#include "support/test_util.hpp"

namespace stepbench::test {

namespace {

// A parameter (or its gradient) in PyTorch's order from its storage in an arena.
Vec oihw(Backend& be, const float* p, const ParamEntry& e) {
  std::vector<float> stored(e.count), out(e.numel());
  be.copy(be.default_stream(), stored.data(), p, e.count * sizeof(float));
  be.synchronize(be.default_stream());
  filter_from_storage(stored.data(), out.data(), e);
  return {out.begin(), out.end()};
}

Vec plus(Vec a, const Vec& b) {
  if (a.empty()) return b;
  for (std::size_t i = 0; i < b.size(); ++i) a[i] += b[i];
  return a;
}
Vec scaled(double k, Vec v) {
  for (auto& x : v) x *= k;
  return v;
}
const Vec& get(const std::map<std::string, Vec>& m, const std::string& k) {
  static const Vec kNone;
  const auto it = m.find(k);
  return it == m.end() ? kNone : it->second;
}

double dist2(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

Vec sq(const Vec& v) {
  Vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = v[i] * v[i];
  return r;
}
Vec root(Vec v) {
  for (auto& x : v) x = std::sqrt(x);
  return v;
}

// Max pooling's backward where rounding may move the maximum: in each window, every input within
// the errors of the oracle's maximum may receive the window's gradient (and its error) instead of it.
Vec max_pool_tie_bound(const Shape& xs, const Vec& x, const Vec& ex, const Shape& ys, const Vec& dy, const Vec& edy,
                       const PoolParams& p) {
  Vec b(x.size(), 0.0);
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t c = 0; c < ys.c; ++c)
      for (std::int64_t oh = 0; oh < ys.h; ++oh)
        for (std::int64_t ow = 0; ow < ys.w; ++ow) {
          const std::int64_t h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
          std::vector<std::size_t> in;
          std::size_t best = 0;
          double mx = -std::numeric_limits<double>::infinity();
          for (std::int64_t h = std::max<std::int64_t>(h0, 0); h < std::min(h0 + p.kh, xs.h); ++h)
            for (std::int64_t w = std::max<std::int64_t>(w0, 0); w < std::min(w0 + p.kw, xs.w); ++w) {
              const auto i = ref::idx(xs, n, c, h, w);
              in.push_back(i);
              if (x[i] > mx) {
                mx = x[i];
                best = i;
              }
            }
          const auto o = ref::idx(ys, n, c, oh, ow);
          const double g = std::abs(dy[o]) + edy[o];  // the gradient with its error, wherever it goes
          bool tied = false;
          for (auto i : in)
            if (i != best && mx - x[i] <= ex[best] + ex[i]) {
              b[i] += g;
              tied = true;
            }
          if (tied) b[best] += g;
        }
  return b;
}

}  // namespace

ChainOracle::ChainOracle(Graph& g) : layers_(g.layers()), dtype_(g.config().dtype) {
  Backend& be = g.backend();
  std::map<ValueId, bool> produced;
  for (const auto& l : layers_) {
    if (l.kind == "dropout") throw std::invalid_argument("ChainOracle: dropout is not modelled; build without it");
    if (l.out >= 0) {
      produced[l.out] = true;
      shapes_[l.out] = g.value(l.out).shape();
    }
  }
  for (const auto& l : layers_)
    for (ValueId v : l.in) {
      if (shapes_.count(v)) continue;
      shapes_[v] = g.value(v).shape();
      auto parts = g.concat_parts(v);
      if (!parts.empty())
        parts_[v] = std::move(parts);
      else if (!produced.count(v))
        input_ = v;
    }
  image_ = read_nchw(be, g.value(input_));
  labels_.resize(static_cast<std::size_t>(g.config().batch));
  be.copy(be.default_stream(), labels_.data(), g.labels(), labels_.size() * sizeof(std::int32_t));
  be.synchronize(be.default_stream());
  params = graph_params(g);
  for (const auto& e : g.params())
    if (!e.trainable) state[e.name] = oihw(be, g.data_of(e), e);
}

void ChainOracle::set_batch(Vec nchw, std::vector<std::int32_t> labels) {
  if (nchw.size() != image_.size() || labels.size() != labels_.size())
    throw std::invalid_argument(fmt::format("ChainOracle::set_batch: {} values and {} labels for {} and {}",
                                            nchw.size(), labels.size(), image_.size(), labels_.size()));
  image_ = std::move(nchw);
  labels_ = std::move(labels);
}

std::map<std::string, Vec> graph_params(Graph& g) {
  std::map<std::string, Vec> r;
  for (const auto& e : g.params())
    if (e.trainable) r[e.name] = oihw(g.backend(), g.data_of(e), e);
  return r;
}

std::map<std::string, Vec> graph_grads(Graph& g) {
  const double scale = g.loss_scaler() ? g.loss_scale(g.backend().default_stream()) : 1.0;
  std::map<std::string, Vec> r;
  for (const auto& e : g.params())
    if (e.trainable) r[e.name] = scaled(1 / scale, oihw(g.backend(), g.grad_of(e), e));
  return r;
}

// What the forward pass keeps for the backward pass, per layer.
struct ChainOracle::Fwd {
  Vec z, ez, y;  // conv_bn_relu: the convolution's output and its bound; the unit's output
  ref::BnSaved saved;
};

ChainOracle::Result ChainOracle::run(const ErrorModel& m, bool backward, bool training) const {
  if (backward && !training) throw std::invalid_argument("ChainOracle::run: backward needs training");
  const double uo = m.u_out, ua = m.u_acc;
  // the 16-bit copies a mixed-precision graph convolves and multiplies with
  auto weights = [&](const std::string& name) {
    return dtype_ == DType::f32 ? params.at(name) : round_to(dtype_, params.at(name));
  };
  auto pbound = [&](const std::string& name) {
    const Vec& b = get(param_bounds, name);
    return b.empty() ? Vec(params.at(name).size(), 0.0) : b;
  };
  std::map<ValueId, Vec> val, err;
  val[input_] = image_;
  err[input_] = Vec(image_.size(), 0.0);
  // a concat's value is its parts', channel after channel
  auto value = [&](ValueId v, const std::map<ValueId, Vec>& from) {
    const auto it = parts_.find(v);
    if (it == parts_.end()) return from.at(v);
    const Shape s = shapes_.at(v);
    Vec r(static_cast<std::size_t>(s.numel()));
    std::int64_t off = 0;
    for (ValueId p : it->second) {
      const Shape ps = shapes_.at(p);
      const Vec& pv = from.at(p);
      for (std::int64_t n = 0; n < s.n; ++n)
        for (std::int64_t c = 0; c < ps.c; ++c)
          for (std::int64_t h = 0; h < s.h; ++h)
            for (std::int64_t w = 0; w < s.w; ++w) r[ref::idx(s, n, off + c, h, w)] = pv[ref::idx(ps, n, c, h, w)];
      off += ps.c;
    }
    return r;
  };
  Result res;
  std::vector<Fwd> kept(layers_.size());
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    const LayerInfo& l = layers_[li];
    if (l.training_only && !training) continue;
    const Vec x = value(l.in[0], val), ex = value(l.in[0], err);
    const Shape xs = shapes_.at(l.in[0]);
    if (l.kind == "add_relu") {
      // y = max(a + b, 0): the sum rounded in fp32, stored; the inputs' errors add (the ReLU is 1-Lipschitz)
      const Vec b = value(l.in[1], val), eb = value(l.in[1], err);
      Vec y;
      ref::add_relu_forward(x, b, y);
      err[l.out] = plus_rounding(axpby(ua, absv(plus(x, b)), 1, plus(ex, eb)), y, uo);
      val[l.out] = std::move(y);
      continue;
    }
    if (l.is_conv_bn()) {
      const Shape ys = shapes_.at(l.out);
      const bool relu = l.kind == "conv_bn_relu";
      const double eps = l.bn_eps;
      const std::string wn = l.weight, gn = l.bn + ".weight", bn = l.bn + ".bias";
      const Vec w = weights(wn);
      Fwd& f = kept[li];
      ref::conv_forward(xs, x, w, ys, f.z, l.conv);
      Vec from_w;
      ref::conv_forward(xs, absv(x), pbound(wn), ys, from_w, l.conv);
      Vec inherited;
      ref::conv_forward(xs, sq(ex), sq(w), ys, inherited, l.conv);
      f.ez = plus(
          plus(conv_forward_bound(xs, x, {}, w, ys, f.z, l.conv, for_conv(m, l.conv_algorithm, ConvDirection::forward)),
               from_w),
          root(inherited));
      if (!training) {
        // y = relu(gamma (z - mean) / sqrt(var + eps) + beta), the ReLU 1-Lipschitz: the errors of
        // z, of the parameters, and the op's own
        const Vec &rm = state.at(l.bn + ".running_mean"), &rv = state.at(l.bn + ".running_var");
        const Vec &gamma = params.at(gn), &beta = params.at(bn), eg = pbound(gn), eb = pbound(bn);
        ref::bn_forward_inference(ys, f.z, gamma, beta, rm, rv, eps, relu, f.y);
        Vec e = bn_inference_bound(ys, f.z, gamma, beta, rm, rv, {}, {}, eps, f.y, m);
        for (std::int64_t n = 0; n < ys.n; ++n)
          for (std::int64_t c = 0; c < ys.c; ++c)
            for (std::int64_t h = 0; h < ys.h; ++h)
              for (std::int64_t q = 0; q < ys.w; ++q) {
                const auto i = ref::idx(ys, n, c, h, q);
                const double is = 1 / std::sqrt(rv[c] + eps);
                e[i] += std::abs(gamma[c]) * is * f.ez[i] + eg[c] * std::abs((f.z[i] - rm[c]) * is) + eb[c];
              }
        val[l.out] = f.y;
        err[l.out] = std::move(e);
        continue;
      }
      ref::bn_forward_training(ys, f.z, params.at(gn), params.at(bn), eps, relu, f.y, f.saved);
      val[l.out] = f.y;
      err[l.out] =
          bn_bounds(ys, f.z, f.ez, params.at(gn), params.at(bn), eps, relu, {}, f.saved, m, {}, pbound(gn), pbound(bn))
              .y;
    } else if (l.kind == "pool") {
      const Shape ys = shapes_.at(l.out);
      Vec y, carried;
      ref::pool_forward(xs, x, ys, y, l.pool);
      ref::pool_forward(xs, ex, ys, carried, l.pool);  // avg: a mean of the errors; max: the largest
      err[l.out] = plus(pool_forward_bound(xs, x, ys, y, l.pool, m), carried);
      val[l.out] = std::move(y);
    } else if (l.kind == "linear") {
      const std::int64_t N = xs.n, K = xs.c, M = shapes_.at(l.out).c;
      const std::string wn = l.name + ".weight", bn = l.name + ".bias";
      const Vec w = weights(wn), &b = params.at(bn);
      Vec y, ay, carried, from_w;
      ref::linear_forward(N, K, M, x, w, b, y);
      ref::linear_forward(N, K, M, absv(x), absv(w), absv(b), ay);
      ref::linear_forward(N, K, M, sq(ex), sq(w), Vec(static_cast<std::size_t>(M), 0.0), carried);
      carried = root(carried);  // the input's errors through the weights; the bias's error adds linearly
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t j = 0; j < M; ++j) carried[n * M + j] += pbound(bn)[j];
      ref::linear_forward(N, K, M, absv(x), pbound(wn), Vec(static_cast<std::size_t>(M), 0.0), from_w);
      // the product is stored in the dtype before the bias (in the dtype too) is added: three roundings
      err[l.out] = plus(plus(plus_rounding(axpby(m.sum(K + 1) + 2 * uo, ay, 0, {}), y, uo), carried), from_w);
      val[l.out] = std::move(y);
    } else if (l.kind == "cross_entropy") {
      const std::int64_t N = xs.n, M = xs.c;
      Vec dz;
      const double loss = ref::softmax_xent(N, M, x, labels_, dz);
      res.loss += l.loss_weight * loss;
      res.logits[l.name] = x;
      res.logits_bound[l.name] = ex;
      // per row: the log of a sum of M exponentials and three terms (as Ops.SoftmaxCrossEntropy),
      // and the logits' errors: |d loss_n| <= sum_j p_j e_j + e_label <= 2 max_j e_j
      double bound = 0, mean_abs_row = 0;
      for (std::int64_t n = 0; n < N; ++n) {
        double mx = -std::numeric_limits<double>::infinity(), se = 0, emax = 0;
        for (std::int64_t j = 0; j < M; ++j) {
          mx = std::max(mx, x[n * M + j]);
          emax = std::max(emax, ex[n * M + j]);
        }
        for (std::int64_t j = 0; j < M; ++j) se += std::exp(x[n * M + j] - mx);
        const double row = std::log(se) + mx - x[n * M + labels_[n]];
        bound += (2 * emax + m.sum(M) + 3 * ua + 2 * ua * (std::abs(std::log(se)) + std::abs(mx) + std::abs(row))) / N;
        mean_abs_row += std::abs(row) / N;
      }
      res.loss_bound += l.loss_weight * (bound + m.sum(N) * mean_abs_row);
    } else {
      throw std::invalid_argument("ChainOracle: layer kind " + l.kind + " is not modelled");
    }
  }
  for (const auto& [v, x] : val) {
    res.values[v] = x;
    res.value_bounds[v] = err.at(v);
  }
  if (!backward) return res;

  std::map<ValueId, Vec> grad, gerr;
  // d adds into v's gradient (split over a concat's parts); a second contribution is an
  // accumulation, stored in the dtype
  std::function<void(ValueId, const Vec&, const Vec&)> add = [&](ValueId v, const Vec& d, const Vec& e) {
    if (v == input_) return;
    const auto it = parts_.find(v);
    if (it != parts_.end()) {
      const Shape s = shapes_.at(v);
      std::int64_t off = 0;
      for (ValueId p : it->second) {
        const Shape ps = shapes_.at(p);
        Vec pd(static_cast<std::size_t>(ps.numel())), pe(pd.size());
        for (std::int64_t n = 0; n < s.n; ++n)
          for (std::int64_t c = 0; c < ps.c; ++c)
            for (std::int64_t h = 0; h < s.h; ++h)
              for (std::int64_t w = 0; w < s.w; ++w) {
                pd[ref::idx(ps, n, c, h, w)] = d[ref::idx(s, n, off + c, h, w)];
                pe[ref::idx(ps, n, c, h, w)] = e[ref::idx(s, n, off + c, h, w)];
              }
        add(p, pd, pe);
        off += ps.c;
      }
      return;
    }
    auto& g = grad[v];
    auto& b = gerr[v];
    if (g.empty()) {
      g = d;
      b = e;
      return;
    }
    for (std::size_t i = 0; i < d.size(); ++i) {
      g[i] += d[i];
      b[i] += e[i] + (ua + uo) * std::abs(g[i]);
    }
  };
  auto set_grad = [&](const std::string& name, Vec d, Vec e) {
    res.grads[name] = std::move(d);
    res.grad_bounds[name] = std::move(e);
  };
  for (std::size_t li = layers_.size(); li-- > 0;) {
    const LayerInfo& l = layers_[li];
    const Vec x = value(l.in[0], val), ex = value(l.in[0], err);
    const Shape xs = shapes_.at(l.in[0]);
    if (l.kind == "cross_entropy") {
      const std::int64_t N = xs.n, M = xs.c;
      Vec dz;
      ref::softmax_xent(N, M, x, labels_, dz);
      Vec e(dz.size());
      for (std::int64_t n = 0; n < N; ++n) {
        double emax = 0;
        for (std::int64_t j = 0; j < M; ++j) emax = std::max(emax, ex[n * M + j]);
        for (std::int64_t j = 0; j < M; ++j) {
          const bool lab = j == labels_[n];
          const double p = dz[n * M + j] * N + (lab ? 1.0 : 0.0);
          // softmax: |dp_j| <= p_j (e_j + sum_k p_k e_k) <= 2 p_j max e; its own rounding as the op test's
          e[n * M + j] = l.loss_weight * (p * (2 * emax + m.sum(M) + 4 * ua) + 2 * ua * (p + (lab ? 1.0 : 0.0))) / N;
        }
      }
      const Vec d = scaled(l.loss_weight, dz);
      add(l.in[0], d, plus_rounding(e, d, uo));
      continue;
    }
    if (!grad.count(l.out)) continue;  // nothing downstream reaches the loss
    const Vec dy = grad.at(l.out), edy = gerr.at(l.out);
    const Shape ys = shapes_.at(l.out);
    if (l.kind == "pool") {
      Vec dx, carried;
      ref::pool_backward(xs, x, ys, dy, dx, l.pool);
      ref::pool_backward(xs, x, ys, edy, carried, l.pool);
      Vec e = plus(pool_backward_bound(xs, x, ys, dy, dx, l.pool, m), carried);
      if (l.pool.kind == PoolKind::max) e = plus(std::move(e), max_pool_tie_bound(xs, x, ex, ys, dy, edy, l.pool));
      add(l.in[0], dx, e);
    } else if (l.kind == "linear") {
      const std::int64_t N = xs.n, K = xs.c, M = ys.c;
      const std::string wn = l.name + ".weight", bn = l.name + ".bias";
      const Vec w = weights(wn);
      Vec dx, dw, db, adx, adw, adb, e1x, e1w, e1b, e2x, e2w, e2b, e3x, e3w, e3b;
      ref::linear_backward(N, K, M, x, w, dy, dx, dw, db);
      ref::linear_backward(N, K, M, absv(x), absv(w), absv(dy), adx, adw, adb);
      // the gradient's error: through the weights in quadrature (e1x), summed over the batch with
      // x >= 0 linearly (e1w, e1b); the weights' error (e2x); the input's error (e3w)
      Vec q1x, q1w, q1b;
      ref::linear_backward(N, K, M, sq(x), sq(w), sq(edy), q1x, q1w, q1b);
      ref::linear_backward(N, K, M, absv(x), absv(w), edy, e1x, e1w, e1b);
      ref::linear_backward(N, K, M, ex, pbound(wn), absv(dy), e2x, e2w, e2b);
      ref::linear_backward(N, K, M, sq(ex), sq(w), sq(dy), e3x, e3w, e3b);
      e1x = root(q1x), e3w = root(e3w);
      set_grad(wn, dw, plus(plus_rounding(axpby(m.batch_sum(N), adw, 1, e1w), dw, uo), e3w));
      set_grad(bn, db, plus_rounding(axpby(m.batch_sum(N), adb, 1, e1b), db, uo));
      add(l.in[0], dx, plus(plus_rounding(axpby(m.sum(M), adx, 1, e1x), dx, uo), e2x));
    } else if (l.kind == "add_relu") {
      // the masked gradient to both inputs; where the sum lies within its error of zero the
      // backend's mask may differ from the oracle's: dy or 0 there
      const Vec b = value(l.in[1], val), eb = value(l.in[1], err);
      Vec g;
      ref::add_relu_backward(val.at(l.out), dy, g);
      Vec e = edy;
      for (std::size_t i = 0; i < g.size(); ++i) {
        const double sum = x[i] + b[i];
        if (std::abs(sum) <= ex[i] + eb[i] + ua * std::abs(sum))
          e[i] += std::abs(dy[i]);
        else if (sum < 0)
          e[i] = 0;
      }
      for (ValueId v : l.in) add(v, g, e);
    } else if (l.is_conv_bn()) {
      const Fwd& f = kept[li];
      const bool relu = l.kind == "conv_bn_relu";
      const double eps = l.bn_eps;
      const std::string wn = l.weight, gn = l.bn + ".weight", bn = l.bn + ".bias";
      const Vec w = weights(wn);
      Vec dz, dgamma, dbeta;
      ref::bn_backward(ys, f.z, f.y, dy, params.at(gn), f.saved, relu, dz, dgamma, dbeta);
      const auto eb = bn_bounds(ys, f.z, f.ez, params.at(gn), params.at(bn), eps, relu, dy, f.saved, m, edy, pbound(gn),
                                pbound(bn));
      Vec dw, from_x;
      ref::conv_backward_filter(xs, x, ys, dz, dw, l.conv);
      Vec from_dz;
      ref::conv_backward_filter(xs, sq(ex), ys, sq(dz), from_x, l.conv);
      ref::conv_backward_filter(xs, absv(x), ys, eb.dx, from_dz, l.conv);  // x >= 0 mostly: linear
      set_grad(wn, dw,
               plus(plus(conv_backward_filter_bound(xs, x, ys, dz, {}, dw, l.conv,
                                                    for_conv(m, l.conv_algorithm, ConvDirection::backward_filter)),
                         root(from_x)),
                    from_dz));
      set_grad(gn, dgamma, eb.dgamma);
      set_grad(bn, dbeta, eb.dbeta);
      if (l.in[0] != input_) {
        Vec dx, from_w;
        ref::conv_backward_data(ys, dz, w, xs, dx, l.conv);
        Vec from_dz;
        ref::conv_backward_data(ys, absv(dz), pbound(wn), xs, from_w, l.conv);
        ref::conv_backward_data(ys, sq(eb.dx), sq(w), xs, from_dz, l.conv);
        add(l.in[0], dx,
            plus(plus(conv_backward_data_bound(ys, dz, {}, w, xs, dx, l.conv,
                                               for_conv(m, l.conv_algorithm, ConvDirection::backward_data)),
                      from_w),
                 root(from_dz)));
      }
    }
  }
  res.value_grads = grad;
  res.value_grad_bounds = gerr;
  return res;
}

OracleSteps oracle_steps(ChainOracle o, const OptimizerConfig& c, int steps, const ErrorModel& m) {
  return oracle_steps(std::vector<ChainOracle>{std::move(o)}, c, steps, m);
}

OracleSteps oracle_steps(std::vector<ChainOracle> towers, const OptimizerConfig& c, int steps, const ErrorModel& m) {
  if (c.kind == OptimizerKind::rmsprop) throw std::invalid_argument("oracle_steps: sgd and momentum only");
  if (towers.empty()) throw std::invalid_argument("oracle_steps: no towers");
  const double ua = m.u_acc, lr = c.lr, mu = c.kind == OptimizerKind::momentum ? c.momentum : 0.0;
  const auto n = static_cast<double>(towers.size());
  ChainOracle& o = towers.front();
  std::map<std::string, Vec> mom, emom;
  OracleSteps out;
  for (int k = 0; k < steps; ++k) {
    // every tower's gradient, then their average: its own rounding as a sum of n terms
    std::map<std::string, Vec> grads, bounds, abs_sum;
    for (const auto& t : towers) {
      const auto r = t.run(m);
      for (const auto& [name, g] : r.grads) {
        const Vec& eg = r.grad_bounds.at(name);
        grads[name] = plus(std::move(grads[name]), scaled(1 / n, g));
        bounds[name] = plus(std::move(bounds[name]), scaled(1 / n, eg));
        abs_sum[name] = plus(std::move(abs_sum[name]), scaled(1 / n, absv(g)));
      }
    }
    if (towers.size() > 1)
      for (auto& [name, b] : bounds)
        b = plus_rounding(axpby(1, b, m.sum(towers.size()), abs_sum.at(name)), grads.at(name), ua);
    for (auto& [name, p] : o.params) {
      const Vec& g = grads.at(name);
      const Vec& eg = bounds.at(name);
      Vec& ep = o.param_bounds[name];
      Vec& s = mom[name];
      Vec& es = emom[name];
      if (ep.empty()) ep.assign(p.size(), 0.0);
      if (s.empty()) s.assign(p.size(), 0.0), es.assign(p.size(), 0.0);
      for (std::size_t i = 0; i < p.size(); ++i) {
        // fp32: g + wd p, mu s + g, p - lr s; each operation rounded once
        const double gi = g[i] + c.weight_decay * p[i];
        const double egi = eg[i] + c.weight_decay * ep[i] + ua * (std::abs(gi) + std::abs(c.weight_decay * p[i]));
        s[i] = mu * s[i] + gi;
        es[i] = mu * es[i] + egi + 2 * ua * std::abs(s[i]);
        p[i] -= lr * s[i];
        ep[i] += lr * es[i] + 2 * ua * (std::abs(p[i]) + lr * std::abs(s[i]));
      }
    }
    for (std::size_t t = 1; t < towers.size(); ++t) {
      towers[t].params = o.params;
      towers[t].param_bounds = o.param_bounds;
    }
    out.after.push_back(o.params);
  }
  out.params = o.params;
  out.bounds = o.param_bounds;
  return out;
}

std::map<std::string, double> rounding_yardstick(std::vector<ChainOracle> towers, const OptimizerConfig& c, int steps,
                                                 const OracleSteps& want, double u, std::uint32_t seed) {
  if (towers.empty()) throw std::invalid_argument("rounding_yardstick: no towers");
  for (auto& [name, p] : towers.front().params) {
    const Vec r = random_vec(p.size(), seed++);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] *= 1 + u * r[i];
  }
  for (std::size_t t = 1; t < towers.size(); ++t) towers[t].params = towers.front().params;
  const auto moved = oracle_steps(std::move(towers), c, steps, ErrorModel{});
  std::map<std::string, double> y;
  for (const auto& [name, w] : want.params) y[name] = dist2(moved.params.at(name), w);
  return y;
}

std::map<std::string, double> yardsticks_apart(const std::map<std::string, Vec>& got,
                                               const std::map<std::string, Vec>& to,
                                               const std::map<std::string, double>& yardstick) {
  std::map<std::string, double> r;
  for (const auto& [name, w] : to) r[name] = dist2(got.at(name), w) / yardstick.at(name);
  return r;
}

testing::AssertionResult params_near(const std::map<std::string, Vec>& got, const std::map<std::string, Vec>& to,
                                     const std::map<std::string, double>& yardstick, double k) {
  std::string bad, worst;
  double worst_ratio = -1;
  for (const auto& [name, r] : yardsticks_apart(got, to, yardstick)) {
    const auto line = fmt::format("{}: {:.3g} yardsticks ({:.3g})", name, r, yardstick.at(name));
    if (!(r <= k)) bad += "\n  " + line;  // NaN fails
    if (!(r <= worst_ratio)) worst_ratio = r, worst = line;
  }
  if (!bad.empty())
    return testing::AssertionFailure() << "over " << k << " yardsticks from the steps in double:" << bad;
  return testing::AssertionSuccess() << "worst " << worst;
}

testing::AssertionResult params_near(Graph& g, const std::map<std::string, Vec>& to,
                                     const std::map<std::string, double>& yardstick, double k) {
  return params_near(graph_params(g), to, yardstick, k);
}

testing::AssertionResult params_within(Graph& g, const OracleSteps& want) {
  const auto got = graph_params(g);
  for (const auto& [name, w] : want.params) {
    auto r = within(got.at(name), w, want.bounds.at(name));
    if (!r) return testing::AssertionFailure() << name << ": " << r.message();
  }
  return testing::AssertionSuccess();
}

}  // namespace stepbench::test
