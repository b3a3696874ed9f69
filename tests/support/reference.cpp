#include "support/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace stepbench::ref {

// Grouped (p.groups): output channel o reads input channels [g Ig, (g + 1) Ig) of its group g, the
// filter O x Ig x KH x KW with Ig = I / groups.
namespace {
struct Groups {
  std::int64_t in_per, out_per;
  Groups(const Shape& xs, const Shape& ys, const ConvParams& p) : in_per(xs.c / p.groups), out_per(ys.c / p.groups) {}
  std::int64_t first_in(std::int64_t o) const { return o / out_per * in_per; }
};
}  // namespace

void conv_forward(const Shape& xs, const Vec& x, const Vec& w, const Shape& ys, Vec& y, const ConvParams& p) {
  const Groups gr(xs, ys, p);
  y.assign(static_cast<std::size_t>(ys.numel()), 0.0);
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t o = 0; o < ys.c; ++o)
      for (std::int64_t oh = 0; oh < ys.h; ++oh)
        for (std::int64_t ow = 0; ow < ys.w; ++ow) {
          double acc = 0;
          for (std::int64_t i = 0; i < gr.in_per; ++i)
            for (int kh = 0; kh < p.kh; ++kh)
              for (int kw = 0; kw < p.kw; ++kw) {
                const std::int64_t ih = oh * p.stride_h - p.pad_h + kh, iw = ow * p.stride_w - p.pad_w + kw;
                if (ih < 0 || ih >= xs.h || iw < 0 || iw >= xs.w) continue;
                acc += x[idx(xs, n, gr.first_in(o) + i, ih, iw)] *
                       w[static_cast<std::size_t>(((o * gr.in_per + i) * p.kh + kh) * p.kw + kw)];
              }
          y[idx(ys, n, o, oh, ow)] = acc;
        }
}

void conv_backward_data(const Shape& ys, const Vec& dy, const Vec& w, const Shape& xs, Vec& dx, const ConvParams& p) {
  const Groups gr(xs, ys, p);
  dx.assign(static_cast<std::size_t>(xs.numel()), 0.0);
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t o = 0; o < ys.c; ++o)
      for (std::int64_t oh = 0; oh < ys.h; ++oh)
        for (std::int64_t ow = 0; ow < ys.w; ++ow)
          for (std::int64_t i = 0; i < gr.in_per; ++i)
            for (int kh = 0; kh < p.kh; ++kh)
              for (int kw = 0; kw < p.kw; ++kw) {
                const std::int64_t ih = oh * p.stride_h - p.pad_h + kh, iw = ow * p.stride_w - p.pad_w + kw;
                if (ih < 0 || ih >= xs.h || iw < 0 || iw >= xs.w) continue;
                dx[idx(xs, n, gr.first_in(o) + i, ih, iw)] +=
                    dy[idx(ys, n, o, oh, ow)] *
                    w[static_cast<std::size_t>(((o * gr.in_per + i) * p.kh + kh) * p.kw + kw)];
              }
}

void conv_backward_filter(const Shape& xs, const Vec& x, const Shape& ys, const Vec& dy, Vec& dw, const ConvParams& p) {
  const Groups gr(xs, ys, p);
  dw.assign(static_cast<std::size_t>(ys.c * gr.in_per * p.kh * p.kw), 0.0);
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t o = 0; o < ys.c; ++o)
      for (std::int64_t oh = 0; oh < ys.h; ++oh)
        for (std::int64_t ow = 0; ow < ys.w; ++ow)
          for (std::int64_t i = 0; i < gr.in_per; ++i)
            for (int kh = 0; kh < p.kh; ++kh)
              for (int kw = 0; kw < p.kw; ++kw) {
                const std::int64_t ih = oh * p.stride_h - p.pad_h + kh, iw = ow * p.stride_w - p.pad_w + kw;
                if (ih < 0 || ih >= xs.h || iw < 0 || iw >= xs.w) continue;
                dw[static_cast<std::size_t>(((o * gr.in_per + i) * p.kh + kh) * p.kw + kw)] +=
                    dy[idx(ys, n, o, oh, ow)] * x[idx(xs, n, gr.first_in(o) + i, ih, iw)];
              }
}

void bn_forward_training(const Shape& s, const Vec& x, const Vec& gamma, const Vec& beta, double eps, bool relu, Vec& y,
                         BnSaved& saved) {
  const double M = static_cast<double>(s.n * s.h * s.w);
  y.assign(x.size(), 0.0);
  saved.mean.assign(static_cast<std::size_t>(s.c), 0.0);
  saved.invstd = saved.var_unbiased = saved.mean;
  for (std::int64_t c = 0; c < s.c; ++c) {
    double sum = 0, sq = 0;
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) sum += x[idx(s, n, c, h, w)];
    const double mean = sum / M;
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) sq += (x[idx(s, n, c, h, w)] - mean) * (x[idx(s, n, c, h, w)] - mean);
    const double var = sq / M, invstd = 1.0 / std::sqrt(var + eps);
    saved.mean[c] = mean;
    saved.invstd[c] = invstd;
    saved.var_unbiased[c] = M > 1 ? sq / (M - 1) : var;
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) {
          const double v = gamma[c] * (x[idx(s, n, c, h, w)] - mean) * invstd + beta[c];
          y[idx(s, n, c, h, w)] = relu ? std::max(v, 0.0) : v;
        }
  }
}

void bn_forward_inference(const Shape& s, const Vec& x, const Vec& gamma, const Vec& beta, const Vec& rmean,
                          const Vec& rvar, double eps, bool relu, Vec& y) {
  y.assign(x.size(), 0.0);
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) {
          const double v = gamma[c] * (x[idx(s, n, c, h, w)] - rmean[c]) / std::sqrt(rvar[c] + eps) + beta[c];
          y[idx(s, n, c, h, w)] = relu ? std::max(v, 0.0) : v;
        }
}

void bn_backward(const Shape& s, const Vec& x, const Vec& y, const Vec& dy, const Vec& gamma, const BnSaved& saved,
                 bool relu, Vec& dx, Vec& dgamma, Vec& dbeta) {
  const double M = static_cast<double>(s.n * s.h * s.w);
  dx.assign(x.size(), 0.0);
  dgamma.assign(static_cast<std::size_t>(s.c), 0.0);
  dbeta = dgamma;
  for (std::int64_t c = 0; c < s.c; ++c) {
    double sg = 0, sgx = 0;
    auto g = [&](std::size_t i) { return (!relu || y[i] > 0) ? dy[i] : 0.0; };
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) {
          const auto i = idx(s, n, c, h, w);
          sg += g(i);
          sgx += g(i) * (x[i] - saved.mean[c]) * saved.invstd[c];
        }
    dbeta[c] = sg;
    dgamma[c] = sgx;
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) {
          const auto i = idx(s, n, c, h, w);
          const double xhat = (x[i] - saved.mean[c]) * saved.invstd[c];
          dx[i] = gamma[c] * saved.invstd[c] / M * (M * g(i) - sg - xhat * sgx);
        }
  }
}

void add_relu_forward(const Vec& a, const Vec& b, Vec& y) {
  y.resize(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) y[i] = std::max(a[i] + b[i], 0.0);
}

void add_relu_backward(const Vec& y, const Vec& dy, Vec& dx) {
  dx.resize(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) dx[i] = y[i] > 0 ? dy[i] : 0.0;
}

namespace {
template <class F>
void windows(const Shape& xs, const Shape& ys, const PoolParams& p, F&& f) {
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t c = 0; c < ys.c; ++c)
      for (std::int64_t oh = 0; oh < ys.h; ++oh)
        for (std::int64_t ow = 0; ow < ys.w; ++ow) {
          const std::int64_t h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
          // PyTorch: the divisor with padding counts the window clipped to the padded input
          const std::int64_t h1 = std::min(h0 + p.kh, xs.h + p.pad_h), w1 = std::min(w0 + p.kw, xs.w + p.pad_w);
          const std::int64_t padded = (h1 - h0) * (w1 - w0);
          std::int64_t valid = 0, best = -1;
          double mx = -std::numeric_limits<double>::infinity(), sum = 0;
          for (std::int64_t h = std::max<std::int64_t>(h0, 0); h < std::min(h1, xs.h); ++h)
            for (std::int64_t w = std::max<std::int64_t>(w0, 0); w < std::min(w1, xs.w); ++w) {
              ++valid;
              f.visit(n, c, h, w, mx, best, sum);
            }
          const double div =
              p.kind == PoolKind::avg_exclude_pad ? static_cast<double>(valid) : static_cast<double>(padded);
          f.done(n, c, oh, ow, mx, best, sum, div);
        }
}
}  // namespace

void pool_forward(const Shape& xs, const Vec& x, const Shape& ys, Vec& y, const PoolParams& p) {
  y.assign(static_cast<std::size_t>(ys.numel()), 0.0);
  struct {
    const Shape& xs;
    const Shape& ys;
    const Vec& x;
    Vec& y;
    const PoolParams& p;
    void visit(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, double& mx, std::int64_t& best,
               double& sum) {
      const double v = x[idx(xs, n, c, h, w)];
      if (v > mx) {
        mx = v;
        best = static_cast<std::int64_t>(idx(xs, n, c, h, w));
      }
      sum += v;
    }
    void done(std::int64_t n, std::int64_t c, std::int64_t oh, std::int64_t ow, double mx, std::int64_t, double sum,
              double div) {
      y[idx(ys, n, c, oh, ow)] = p.kind == PoolKind::max ? mx : sum / div;
    }
  } f{xs, ys, x, y, p};
  windows(xs, ys, p, f);
}

void pool_backward(const Shape& xs, const Vec& x, const Shape& ys, const Vec& dy, Vec& dx, const PoolParams& p) {
  dx.assign(static_cast<std::size_t>(xs.numel()), 0.0);
  struct {
    const Shape& xs;
    const Shape& ys;
    const Vec& x;
    const Vec& dy;
    Vec& dx;
    const PoolParams& p;
    std::vector<std::size_t> members;
    void visit(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, double& mx, std::int64_t& best,
               double&) {
      const double v = x[idx(xs, n, c, h, w)];
      if (v > mx) {
        mx = v;
        best = static_cast<std::int64_t>(idx(xs, n, c, h, w));
      }
      members.push_back(idx(xs, n, c, h, w));
    }
    void done(std::int64_t n, std::int64_t c, std::int64_t oh, std::int64_t ow, double, std::int64_t best, double,
              double div) {
      const double g = dy[idx(ys, n, c, oh, ow)];
      if (p.kind == PoolKind::max)
        dx[static_cast<std::size_t>(best)] += g;
      else
        for (auto i : members) dx[i] += g / div;
      members.clear();
    }
  } f{xs, ys, x, dy, dx, p, {}};
  windows(xs, ys, p, f);
}

void linear_forward(std::int64_t N, std::int64_t K, std::int64_t M, const Vec& x, const Vec& w, const Vec& b, Vec& y) {
  y.assign(static_cast<std::size_t>(N * M), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t m = 0; m < M; ++m) {
      double acc = b[m];
      for (std::int64_t k = 0; k < K; ++k) acc += x[n * K + k] * w[m * K + k];
      y[n * M + m] = acc;
    }
}

void linear_backward(std::int64_t N, std::int64_t K, std::int64_t M, const Vec& x, const Vec& w, const Vec& dy, Vec& dx,
                     Vec& dw, Vec& db) {
  dx.assign(static_cast<std::size_t>(N * K), 0.0);
  dw.assign(static_cast<std::size_t>(M * K), 0.0);
  db.assign(static_cast<std::size_t>(M), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t m = 0; m < M; ++m) {
      db[m] += dy[n * M + m];
      for (std::int64_t k = 0; k < K; ++k) {
        dx[n * K + k] += dy[n * M + m] * w[m * K + k];
        dw[m * K + k] += dy[n * M + m] * x[n * K + k];
      }
    }
}

double softmax_xent(std::int64_t N, std::int64_t M, const Vec& z, const std::vector<std::int32_t>& labels, Vec& dz) {
  dz.assign(static_cast<std::size_t>(N * M), 0.0);
  double loss = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (std::int64_t m = 0; m < M; ++m) mx = std::max(mx, z[n * M + m]);
    for (std::int64_t m = 0; m < M; ++m) sum += std::exp(z[n * M + m] - mx);
    loss += std::log(sum) + mx - z[n * M + labels[n]];
    for (std::int64_t m = 0; m < M; ++m)
      dz[n * M + m] = (std::exp(z[n * M + m] - mx) / sum - (m == labels[n] ? 1.0 : 0.0)) / static_cast<double>(N);
  }
  return loss / static_cast<double>(N);
}

void optimizer_update(const OptimizerConfig& c, Vec& p, const Vec& g, Vec& s0, Vec& s1) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] + c.weight_decay * p[i];
    switch (c.kind) {
      case OptimizerKind::sgd: p[i] -= c.lr * gi; break;
      case OptimizerKind::momentum:
        s0[i] = c.momentum * s0[i] + gi;
        p[i] -= c.lr * s0[i];
        break;
      case OptimizerKind::rmsprop:
        s0[i] = c.rms_decay * s0[i] + (1 - c.rms_decay) * gi * gi;
        s1[i] = c.momentum * s1[i] + c.lr * gi / std::sqrt(s0[i] + c.epsilon);
        p[i] -= s1[i];
        break;
    }
  }
}

void bias_act_forward(const Shape& s, const Vec& x, const Vec& b, bool relu, Vec& y) {
  y.assign(x.size(), 0.0);
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) {
          const std::size_t i = idx(s, n, c, h, w);
          const double v = x[i] + b[static_cast<std::size_t>(c)];
          y[i] = relu ? std::max(v, 0.0) : v;
        }
}

void bias_act_backward(const Shape& s, const Vec& y, const Vec& dy, bool relu, Vec& g, Vec& db) {
  g.assign(dy.size(), 0.0);
  db.assign(static_cast<std::size_t>(s.c), 0.0);
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) {
          const std::size_t i = idx(s, n, c, h, w);
          g[i] = !relu || y[i] > 0 ? dy[i] : 0.0;
          db[static_cast<std::size_t>(c)] += g[i];
        }
}

namespace {
// AdaptiveAvgPool2d's window of output o over an input of `in`: [floor(o in / out), ceil((o + 1) in / out))
std::int64_t adaptive_lo(std::int64_t o, std::int64_t in, std::int64_t out) {
  return static_cast<std::int64_t>(std::floor(static_cast<double>(o * in) / static_cast<double>(out)));
}
std::int64_t adaptive_hi(std::int64_t o, std::int64_t in, std::int64_t out) {
  return static_cast<std::int64_t>(std::ceil(static_cast<double>((o + 1) * in) / static_cast<double>(out)));
}
}  // namespace

void adaptive_avg_pool_forward(const Shape& xs, const Vec& x, const Shape& ys, Vec& y) {
  y.assign(static_cast<std::size_t>(ys.numel()), 0.0);
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t c = 0; c < ys.c; ++c)
      for (std::int64_t oh = 0; oh < ys.h; ++oh)
        for (std::int64_t ow = 0; ow < ys.w; ++ow) {
          const std::int64_t h0 = adaptive_lo(oh, xs.h, ys.h), h1 = adaptive_hi(oh, xs.h, ys.h);
          const std::int64_t w0 = adaptive_lo(ow, xs.w, ys.w), w1 = adaptive_hi(ow, xs.w, ys.w);
          double sum = 0;
          for (std::int64_t h = h0; h < h1; ++h)
            for (std::int64_t w = w0; w < w1; ++w) sum += x[idx(xs, n, c, h, w)];
          y[idx(ys, n, c, oh, ow)] = sum / static_cast<double>((h1 - h0) * (w1 - w0));
        }
}

void adaptive_avg_pool_backward(const Shape& xs, const Shape& ys, const Vec& dy, Vec& dx) {
  dx.assign(static_cast<std::size_t>(xs.numel()), 0.0);
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t c = 0; c < ys.c; ++c)
      for (std::int64_t oh = 0; oh < ys.h; ++oh)
        for (std::int64_t ow = 0; ow < ys.w; ++ow) {
          const std::int64_t h0 = adaptive_lo(oh, xs.h, ys.h), h1 = adaptive_hi(oh, xs.h, ys.h);
          const std::int64_t w0 = adaptive_lo(ow, xs.w, ys.w), w1 = adaptive_hi(ow, xs.w, ys.w);
          const double g = dy[idx(ys, n, c, oh, ow)] / static_cast<double>((h1 - h0) * (w1 - w0));
          for (std::int64_t h = h0; h < h1; ++h)
            for (std::int64_t w = w0; w < w1; ++w) dx[idx(xs, n, c, h, w)] += g;
        }
}

}  // namespace stepbench::ref
