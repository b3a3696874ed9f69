#include "support/error_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "support/test_util.hpp"

namespace stepbench::test {

double ErrorModel::sum(std::int64_t K) const {
  return 2 * u_in + kSigmas * std::sqrt(static_cast<double>(std::max<std::int64_t>(K, 1))) * u_acc;
}
double ErrorModel::batch_sum(std::int64_t K) const {
  if (towers <= 1) return sum(K);
  const auto part = static_cast<double>(std::max<std::int64_t>(K / towers, 1));
  return 2 * u_in + kSigmas * (std::sqrt(part) + std::sqrt(static_cast<double>(towers))) * u_acc;
}
double ErrorModel::conv(std::int64_t K) const {
  // an algorithm either accumulates atomically in 16 bits or goes through a transform, not both
  return 2 * u_in + kSigmas * std::sqrt(static_cast<double>(std::max<std::int64_t>(K, 1))) *
                        std::max(u_conv_acc, u_acc * transform);
}

ErrorModel error_model(const Config& c) {
  ErrorModel m;
  m.u_in = c.tf32 ? 0x1p-11 : 0.0;
  m.u_out = unit_roundoff(c.dtype);
  m.transform = c.backend == "cuda" ? kTransform : 1.0;
  m.u_conv_acc = c.backend == "cuda" && c.dtype != DType::f32 ? m.u_out : m.u_acc;
  return m;
}

ErrorModel for_conv(const ErrorModel& m, const std::string& algorithm, ConvDirection d) {
  if (m.transform == 1) return m;
  int algo[3] = {-1, -1, -1};
  if (std::sscanf(algorithm.c_str(), "cudnn fwd algo %d / bwd_data algo %d / bwd_filter algo %d", &algo[0], &algo[1],
                  &algo[2]) != 3)
    return m;
  const int a = algo[static_cast<int>(d)];
  bool transform = false;
  switch (d) {
    case ConvDirection::forward:  // FFT, FFT_TILING, WINOGRAD, WINOGRAD_NONFUSED
      transform = a >= 4 && a <= 7;
      break;
    case ConvDirection::backward_data:  // FFT, FFT_TILING, WINOGRAD, WINOGRAD_NONFUSED
      transform = a >= 2 && a <= 5;
      break;
    case ConvDirection::backward_filter:  // FFT, WINOGRAD, WINOGRAD_NONFUSED, FFT_TILING (3 is ALGO_3)
      transform = a == 2 || (a >= 4 && a <= 6);
      break;
  }
  ErrorModel r = m;
  if (!transform) r.transform = 1;
  return r;
}

Vec absv(const Vec& v) {
  Vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = std::abs(v[i]);
  return r;
}
Vec axpby(double a, const Vec& x, double b, const Vec& y) {
  Vec r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = a * x[i] + (y.empty() ? 0.0 : b * y[i]);
  return r;
}
Vec plus_rounding(Vec bound, const Vec& v, double u) {
  for (std::size_t i = 0; i < bound.size(); ++i) bound[i] += u * std::abs(v[i]);
  return bound;
}

Vec conv_forward_bound(const Shape& xs, const Vec& x, const Vec& ex, const Vec& w, const Shape& ys, const Vec& y,
                       const ConvParams& p, const ErrorModel& m) {
  // m.conv(K) |x| + ex, through |w|
  Vec a;
  ref::conv_forward(xs, axpby(m.conv(xs.c / p.groups * p.kh * p.kw), absv(x), 1.0, ex), absv(w), ys, a, p);
  return plus_rounding(std::move(a), y, m.u_out);
}
Vec conv_backward_data_bound(const Shape& ys, const Vec& dy, const Vec& edy, const Vec& w, const Shape& xs,
                             const Vec& dx, const ConvParams& p, const ErrorModel& m) {
  Vec a;
  ref::conv_backward_data(ys, axpby(m.conv(ys.c / p.groups * p.kh * p.kw), absv(dy), 1.0, edy), absv(w), xs, a, p);
  return plus_rounding(std::move(a), dx, m.u_out);
}
Vec conv_backward_filter_bound(const Shape& xs, const Vec& x, const Shape& ys, const Vec& dy, const Vec& edy,
                               const Vec& dw, const ConvParams& p, const ErrorModel& m) {
  Vec a;
  ref::conv_backward_filter(xs, absv(x), ys, axpby(m.conv(ys.n * ys.h * ys.w), absv(dy), 1.0, edy), a, p);
  return plus_rounding(std::move(a), dw, m.u_out);
}

BnBounds bn_bounds(const Shape& s, const Vec& x, const Vec& ex, const Vec& gamma, const Vec& beta, double eps,
                   bool relu, const Vec& dy, const ref::BnSaved& saved, const ErrorModel& m, const Vec& edy,
                   const Vec& egamma, const Vec& ebeta) {
  const std::int64_t M = s.n * s.h * s.w;
  const double Md = static_cast<double>(M), ua = m.u_acc, sM = m.sum(M);
  BnBounds b;
  b.y.assign(x.size(), 0.0);
  b.dx = b.y;
  b.mean.assign(static_cast<std::size_t>(s.c), 0.0);
  b.invstd = b.var_unbiased = b.dgamma = b.dbeta = b.mean;
  std::vector<std::size_t> at;
  for (std::int64_t c = 0; c < s.c; ++c) {
    at.clear();
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) at.push_back(ref::idx(s, n, c, h, w));
    const double mu = saved.mean[c], is = saved.invstd[c], g = gamma[c], bt = beta[c];
    const double eg_c = egamma.empty() ? 0.0 : egamma[c], eb_c = ebeta.empty() ? 0.0 : ebeta[c];
    const double var = 1.0 / (is * is) - eps;
    auto e = [&](std::size_t i) { return ex.empty() ? 0.0 : ex[i]; };
    // statistics: the mean of M values (inherited errors add linearly: neighbouring elements'
    // errors come from the same upstream roundings, and a mean does not cancel them), the mean of
    // squared deviations (weighted by x - mean, of either sign: in quadrature)
    double mean_ex = 0, mean_abs = 0, mean_dev = 0, ss_dev = 0;
    for (auto i : at) {
      mean_ex += e(i) / Md;
      mean_abs += std::abs(x[i]) / Md;
      mean_dev += std::abs(x[i] - mu) / Md;
      ss_dev += 4 * (x[i] - mu) * (x[i] - mu) * e(i) * e(i);
    }
    const double e_mu = mean_ex + sM * mean_abs;
    const double e_var = std::sqrt(ss_dev) / Md + 2 * mean_dev * e_mu + sM * var;
    const double rel_sigma = e_var / (2 * (var + eps)) + ua;  // relative error of sqrt(var + eps)
    b.mean[c] = e_mu;
    b.invstd[c] = is * (rel_sigma + 2 * ua);
    b.var_unbiased[c] = e_var * Md / std::max(Md - 1, 1.0);
    // y = gamma * xhat + beta, xhat = (x - mean) * invstd
    std::vector<double> xh(at.size()), exh(at.size()), pre(at.size());
    for (std::size_t k = 0; k < at.size(); ++k) {
      const auto i = at[k];
      xh[k] = (x[i] - mu) * is;
      exh[k] = is * (e(i) + e_mu) + std::abs(xh[k]) * (rel_sigma + 3 * ua);
      pre[k] = g * xh[k] + bt;
      const double ey =
          std::abs(g) * exh[k] + eg_c * std::abs(xh[k]) + eb_c + 2 * ua * (std::abs(g * xh[k]) + std::abs(bt));
      b.y[i] = ey + m.u_out * std::abs(relu ? std::max(pre[k], 0.0) : pre[k]);
    }
    if (dy.empty()) continue;
    // backward: g = dy masked by the ReLU; k2 = mean(g), k3 = mean(g * xhat)
    // (k2's inherited errors linearly, as the mean's; k3's, weighted by xhat, in quadrature; a
    // flipped ReLU's whole gradient linearly)
    double k2 = 0, k3 = 0, ek2 = 0, ek3 = 0, abs_g = 0, abs_gx = 0, ss3 = 0;
    std::vector<double> gv(at.size()), eg(at.size());
    for (std::size_t k = 0; k < at.size(); ++k) {
      const auto i = at[k];
      const bool on = !relu || pre[k] > 0;
      gv[k] = on ? dy[i] : 0.0;
      const double e_dy = edy.empty() ? 0.0 : edy[i];
      // within its error of zero, the backend's ReLU may decide the other way
      const bool flips = relu && std::abs(pre[k]) <= b.y[i];
      eg[k] = flips ? std::abs(dy[i]) + e_dy : on ? e_dy : 0.0;
      k2 += gv[k] / Md;
      k3 += gv[k] * xh[k] / Md;
      const double e_own = on || flips ? e_dy : 0.0, flip = flips ? std::abs(dy[i]) : 0.0;
      ek2 += (flip + e_own) / Md;
      const double e_x = is * e(i);  // this element's own error in xhat; the rest of exh is shared
      ss3 += e_own * e_own * xh[k] * xh[k] + gv[k] * gv[k] * e_x * e_x;
      ek3 += (flip * std::abs(xh[k]) + std::abs(gv[k]) * (exh[k] - e_x)) / Md;
      abs_g += std::abs(gv[k]) / Md;
      abs_gx += std::abs(gv[k] * xh[k]) / Md;
    }
    ek2 += sM * abs_g;
    ek3 += std::sqrt(ss3) / Md + sM * abs_gx;
    b.dbeta[c] = Md * ek2 + ua * Md * abs_g;
    b.dgamma[c] = Md * ek3 + ua * Md * abs_gx;
    const double k1 = std::abs(g) * is, ek1 = k1 * (rel_sigma + 2 * ua) + eg_c * is;
    for (std::size_t k = 0; k < at.size(); ++k) {
      const auto i = at[k];
      const double inner = gv[k] - k2 - xh[k] * k3;
      const double terms = std::abs(gv[k]) + std::abs(k2) + std::abs(xh[k] * k3);
      const double edx = ek1 * std::abs(inner) + k1 * (eg[k] + ek2 + exh[k] * std::abs(k3) + std::abs(xh[k]) * ek3) +
                         4 * ua * k1 * terms;
      b.dx[i] = edx + m.u_out * k1 * std::abs(inner);
    }
  }
  return b;
}

Vec bn_inference_bound(const Shape& s, const Vec& x, const Vec& gamma, const Vec& beta, const Vec& rmean,
                       const Vec& rvar, const Vec& erm, const Vec& erv, double eps, const Vec& y, const ErrorModel& m) {
  Vec b(x.size(), 0.0);
  const double ua = m.u_acc;
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c) {
      const double sr = std::sqrt(rvar[c] + eps);
      const double e_rm = erm.empty() ? 0.0 : erm[c], e_rv = erv.empty() ? 0.0 : erv[c];
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) {
          const auto i = ref::idx(s, n, c, h, w);
          const double d = x[i] - rmean[c];
          // the kernel's form, y = a x + b with a = gamma / sr and b = beta - a mean, each rounded: where x
          // is near a large mean, a x and b are large and cancel, and their roundings do not
          const double a = gamma[c] / sr;
          b[i] = std::abs(gamma[c]) / sr * (e_rm + std::abs(d) * (e_rv / (2 * (rvar[c] + eps)) + 3 * ua)) +
                 3 * ua * (std::abs(gamma[c] * d / sr) + std::abs(beta[c])) +
                 3 * ua * (std::abs(a * x[i]) + std::abs(beta[c] - a * rmean[c]) + std::abs(a * rmean[c])) +
                 m.u_out * std::abs(y[i]);
        }
    }
  return b;
}

Vec pool_forward_bound(const Shape& xs, const Vec& x, const Shape& ys, const Vec& y, const PoolParams& p,
                       const ErrorModel& m) {
  if (p.kind == PoolKind::max) return plus_rounding(Vec(y.size(), 0.0), y, m.u_out);  // a copy of one input
  Vec a;
  ref::pool_forward(xs, absv(x), ys, a, p);
  for (auto& v : a) v *= m.sum(p.kh * p.kw) + m.u_acc;  // the sum, then the division
  return plus_rounding(std::move(a), y, m.u_out);
}
Vec pool_backward_bound(const Shape& xs, const Vec& x, const Shape& ys, const Vec& dy, const Vec& dx,
                        const PoolParams& p, const ErrorModel& m) {
  // each input gathers from the windows that hold it: at most ceil(k / stride)^2 of them
  const std::int64_t windows = ((p.kh + p.stride_h - 1) / p.stride_h) * ((p.kw + p.stride_w - 1) / p.stride_w);
  Vec a;
  ref::pool_backward(xs, x, ys, absv(dy), a, p);
  for (auto& v : a) v *= m.sum(windows) + m.u_acc;
  return plus_rounding(std::move(a), dx, m.u_out);
}

testing::AssertionResult within(const Vec& got, const Vec& want, const Vec& bound) {
  if (got.size() != want.size() || want.size() != bound.size())
    return testing::AssertionFailure() << fmt::format("{} values against {} expected ({} bounds)", got.size(),
                                                      want.size(), bound.size());
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    const double r = d == 0 ? 0.0 : bound[i] > 0 ? d / bound[i] : INFINITY;
    if (!(d <= bound[i])) ++bad;  // NaN fails
    if (!(r <= worst_ratio)) {
      worst_ratio = r;
      worst = i;
    }
  }
  const auto msg = fmt::format("element {}: got {:.9g}, want {:.9g}, |difference| {:.3g} = {:.3g} x its bound {:.3g}",
                               worst, got.empty() ? 0.0 : got[worst], want.empty() ? 0.0 : want[worst],
                               got.empty() ? 0.0 : std::abs(got[worst] - want[worst]), worst_ratio,
                               bound.empty() ? 0.0 : bound[worst]);
  // ERROR_MODEL_VERBOSE=1: every comparison's worst element, to see how close to its bound a
  // backend runs (the margin a planted fault must exceed)
  if (std::getenv("ERROR_MODEL_VERBOSE")) std::printf("  error model: %zu values, worst %s\n", got.size(), msg.c_str());
  if (bad)
    return testing::AssertionFailure() << bad << " of " << got.size() << " outside the error model; worst " << msg;
  return testing::AssertionSuccess() << "worst " << msg;
}

}  // namespace stepbench::test
