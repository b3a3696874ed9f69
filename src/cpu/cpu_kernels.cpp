#include "cpu/cpu_kernels.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "stepbench/error.hpp"

namespace stepbench::cpu {
namespace {

// Channel stride: a compile-time 1 for channels-last tensors, so the inner loops vectorise.
template <bool CL>
inline std::int64_t cstride(const Tensor& t) {
  return CL ? 1 : t.desc.strides.c;
}

// Calls body(n, h, w) for every pixel of `s`, in parallel over rows.
template <class F>
void for_each_pixel(const Shape& s, F&& body) {
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t w = 0; w < s.w; ++w) body(n, h, w);
}

template <class F>
void dispatch_layout(const Tensor& t, F&& f) {
  if (t.desc.layout == Layout::nhwc) f(std::true_type{});
  else f(std::false_type{});
}

void check_f32(const Tensor& t, const char* what) {
  SB_CHECK(t.desc.dtype == DType::f32, fmt::format("{}: the cpu kernels take fp32 tensors", what));
}

// Per-channel sums over all pixels of f(pixel pointer offsets...) into out[C], with per-thread
// double accumulators in scratch (threads x C x K).
template <bool CL, int K, class F>
void channel_sums(const Shape& s, double* scratch, double* out, F&& f) {
  const std::int64_t C = s.c;
  const int T = omp_get_max_threads();
  std::fill(scratch, scratch + static_cast<std::size_t>(T) * C * K, 0.0);
#pragma omp parallel
  {
    double* acc = scratch + static_cast<std::size_t>(omp_get_thread_num()) * C * K;
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) f(acc, n, h, w);
  }
  std::fill(out, out + C * K, 0.0);
  for (int t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < C * K; ++i) out[i] += scratch[static_cast<std::size_t>(t) * C * K + i];
}

// y = relu?(a[c] * x + b[c]): channel-contiguous per pixel for NHWC, plane by plane for NCHW (each
// (n, c) row of w is contiguous even in a channel slice), so both layouts stream through memory.
void affine_per_channel(const Tensor& x, const Tensor& y, const float* a, const float* b, bool relu) {
  const Shape& s = x.shape();
  const std::int64_t C = s.c;
  const float* X = x.as<float>();
  float* Y = y.as<float>();
  if (x.desc.layout == Layout::nhwc) {
    for_each_pixel(s, [&](std::int64_t n, std::int64_t h, std::int64_t w) {
      const float* px = X + x.desc.offset(n, 0, h, w);
      float* py = Y + y.desc.offset(n, 0, h, w);
      if (relu) {
        for (std::int64_t c = 0; c < C; ++c) py[c] = std::max(a[c] * px[c] + b[c], 0.0f);
      } else {
        for (std::int64_t c = 0; c < C; ++c) py[c] = a[c] * px[c] + b[c];
      }
    });
    return;
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const float ac = a[c], bc = b[c];
      for (std::int64_t h = 0; h < s.h; ++h) {
        const float* px = X + x.desc.offset(n, c, h, 0);
        float* py = Y + y.desc.offset(n, c, h, 0);
        if (relu) {
          for (std::int64_t w = 0; w < s.w; ++w) py[w] = std::max(ac * px[w] + bc, 0.0f);
        } else {
          for (std::int64_t w = 0; w < s.w; ++w) py[w] = ac * px[w] + bc;
        }
      }
    }
}

}  // namespace

std::size_t bn_scratch_doubles(std::int64_t channels) {
  return static_cast<std::size_t>(omp_get_max_threads() + 1) * channels * 2;
}

void bn_forward_training(const Tensor& x, const Tensor& y, const float* gamma, const float* beta, float* running_mean,
                         float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p,
                         double* scratch) {
  check_f32(x, "batch norm");
  const Shape& s = x.shape();
  const std::int64_t C = s.c;
  const double M = static_cast<double>(s.n * s.h * s.w);
  double* totals = scratch + static_cast<std::size_t>(omp_get_max_threads()) * C * 2;
  const float* X = x.as<float>();
  dispatch_layout(x, [&](auto cl) {
    constexpr bool CL = decltype(cl)::value;
    const std::int64_t xc = cstride<CL>(x);
    // pass 1: mean
    channel_sums<CL, 1>(s, scratch, totals, [&](double* acc, std::int64_t n, std::int64_t h, std::int64_t w) {
      const float* px = X + x.desc.offset(n, 0, h, w);
      for (std::int64_t c = 0; c < C; ++c) acc[c] += px[c * xc];
    });
    for (std::int64_t c = 0; c < C; ++c) save_mean[c] = static_cast<float>(totals[c] / M);
    // pass 2: variance around the mean (two passes: no cancellation)
    channel_sums<CL, 1>(s, scratch, totals, [&](double* acc, std::int64_t n, std::int64_t h, std::int64_t w) {
      const float* px = X + x.desc.offset(n, 0, h, w);
      for (std::int64_t c = 0; c < C; ++c) {
        const double d = px[c * xc] - save_mean[c];
        acc[c] += d * d;
      }
    });
  });
  float* a = reinterpret_cast<float*>(scratch);  // scratch is free again: reuse for scale/shift
  float* b = a + C;
  for (std::int64_t c = 0; c < C; ++c) {
    const double var = totals[c] / M;
    const double invstd = 1.0 / std::sqrt(var + p.eps);
    save_invstd[c] = static_cast<float>(invstd);
    const double unbiased = M > 1 ? var * M / (M - 1) : var;
    running_mean[c] = static_cast<float>((1 - p.momentum) * running_mean[c] + p.momentum * save_mean[c]);
    running_var[c] = static_cast<float>((1 - p.momentum) * running_var[c] + p.momentum * unbiased);
    a[c] = static_cast<float>(gamma[c] * invstd);
    b[c] = static_cast<float>(beta[c] - save_mean[c] * gamma[c] * invstd);
  }
  affine_per_channel(x, y, a, b, p.relu);
}

void bn_forward_inference(const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                          const float* running_mean, const float* running_var, const BatchNormParams& p,
                          double* scratch) {
  check_f32(x, "batch norm");
  const std::int64_t C = x.shape().c;
  float* a = reinterpret_cast<float*>(scratch);
  float* b = a + C;
  for (std::int64_t c = 0; c < C; ++c) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + p.eps);
    a[c] = static_cast<float>(gamma[c] * invstd);
    b[c] = static_cast<float>(beta[c] - running_mean[c] * gamma[c] * invstd);
  }
  affine_per_channel(x, y, a, b, p.relu);
}

void bn_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* gamma,
                 const float* save_mean, const float* save_invstd, float* dgamma, float* dbeta, float beta_dx,
                 bool relu, double* scratch) {
  check_f32(x, "batch norm backward");
  const Shape& s = x.shape();
  const std::int64_t C = s.c;
  const double M = static_cast<double>(s.n * s.h * s.w);
  double* totals = scratch + static_cast<std::size_t>(omp_get_max_threads()) * C * 2;
  const float *X = x.as<float>(), *Y = y.as<float>(), *DY = dy.as<float>();
  float* DX = dx.as<float>();
  dispatch_layout(x, [&](auto cl) {
    constexpr bool CL = decltype(cl)::value;
    const std::int64_t xc = cstride<CL>(x), yc = cstride<CL>(y), dyc = cstride<CL>(dy), dxc = cstride<CL>(dx);
    // totals[2c] = sum(dy'), totals[2c+1] = sum(dy' * xhat), dy' = dy masked by the fused ReLU
    channel_sums<CL, 2>(s, scratch, totals, [&](double* acc, std::int64_t n, std::int64_t h, std::int64_t w) {
      const float* px = X + x.desc.offset(n, 0, h, w);
      const float* py = Y + y.desc.offset(n, 0, h, w);
      const float* pdy = DY + dy.desc.offset(n, 0, h, w);
      for (std::int64_t c = 0; c < C; ++c) {
        const float g = (!relu || py[c * yc] > 0.0f) ? pdy[c * dyc] : 0.0f;
        acc[2 * c] += g;
        acc[2 * c + 1] += g * (px[c * xc] - save_mean[c]) * save_invstd[c];
      }
    });
    float* k1 = reinterpret_cast<float*>(scratch);
    float* k2 = k1 + C;
    float* k3 = k2 + C;
    for (std::int64_t c = 0; c < C; ++c) {
      dbeta[c] = static_cast<float>(totals[2 * c]);
      dgamma[c] = static_cast<float>(totals[2 * c + 1]);
      // dx = gamma*invstd * (dy' - sum(dy')/M - xhat * sum(dy' xhat)/M)
      k1[c] = gamma[c] * save_invstd[c];
      k2[c] = static_cast<float>(totals[2 * c] / M);
      k3[c] = static_cast<float>(totals[2 * c + 1] / M) * save_invstd[c];
    }
    for_each_pixel(s, [&](std::int64_t n, std::int64_t h, std::int64_t w) {
      const float* px = X + x.desc.offset(n, 0, h, w);
      const float* py = Y + y.desc.offset(n, 0, h, w);
      const float* pdy = DY + dy.desc.offset(n, 0, h, w);
      float* pdx = DX + dx.desc.offset(n, 0, h, w);
      for (std::int64_t c = 0; c < C; ++c) {
        const float g = (!relu || py[c * yc] > 0.0f) ? pdy[c * dyc] : 0.0f;
        const float v = k1[c] * (g - k2[c] - (px[c * xc] - save_mean[c]) * k3[c]);
        pdx[c * dxc] = beta_dx == 0.0f ? v : v + beta_dx * pdx[c * dxc];
      }
    });
  });
}

// ---- pooling -------------------------------------------------------------------------------------
namespace {
struct Window {
  std::int64_t h0, h1, w0, w1;  // clamped to the input
  float inv_count;              // 1 / divisor for average pools
};
inline Window pool_window(const PoolParams& p, const Shape& xs, std::int64_t oh, std::int64_t ow) {
  std::int64_t hs = oh * p.stride_h - p.pad_h, ws = ow * p.stride_w - p.pad_w;
  std::int64_t he = std::min(hs + p.kh, xs.h + p.pad_h), we = std::min(ws + p.kw, xs.w + p.pad_w);
  const std::int64_t padded = (he - hs) * (we - ws);  // PyTorch's divisor with count_include_pad
  Window win{std::max<std::int64_t>(hs, 0), std::min(he, xs.h), std::max<std::int64_t>(ws, 0), std::min(we, xs.w),
             1.0f};
  const std::int64_t count =
      p.kind == PoolKind::avg_exclude_pad ? (win.h1 - win.h0) * (win.w1 - win.w0) : padded;
  win.inv_count = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
  return win;
}
// Range of outputs whose window covers input index i: o*s - pad <= i < o*s - pad + k.
inline void covering(std::int64_t i, int k, int s, int pad, std::int64_t out, std::int64_t& o0, std::int64_t& o1) {
  const std::int64_t num = i + pad - k + 1;
  o0 = num <= 0 ? 0 : (num + s - 1) / s;
  o1 = std::min<std::int64_t>((i + pad) / s + 1, out);
}
}  // namespace

void pool_forward(const Tensor& x, const Tensor& y, const PoolParams& p, std::int32_t* argmax) {
  check_f32(x, "pooling");
  const Shape &xs = x.shape(), &ys = y.shape();
  const std::int64_t C = xs.c;
  const float* X = x.as<float>();
  float* Y = y.as<float>();
  const Strides idx = dense_strides(ys, y.desc.layout);  // argmax storage order
  dispatch_layout(x, [&](auto cl) {
    constexpr bool CL = decltype(cl)::value;
    const std::int64_t xc = cstride<CL>(x), yc = cstride<CL>(y), ic = CL ? 1 : idx.c;
    for_each_pixel(ys, [&](std::int64_t n, std::int64_t oh, std::int64_t ow) {
      const Window win = pool_window(p, xs, oh, ow);
      float* py = Y + y.desc.offset(n, 0, oh, ow);
      if (p.kind == PoolKind::max) {
        std::int32_t* pa = argmax ? argmax + n * idx.n + oh * idx.h + ow * idx.w : nullptr;
        const auto first = static_cast<std::int32_t>(win.h0 * xs.w + win.w0);
        for (std::int64_t c = 0; c < C; ++c) py[c * yc] = -std::numeric_limits<float>::infinity();
        if (pa)
          for (std::int64_t c = 0; c < C; ++c) pa[c * ic] = first;
        for (std::int64_t h = win.h0; h < win.h1; ++h)
          for (std::int64_t w = win.w0; w < win.w1; ++w) {
            const float* px = X + x.desc.offset(n, 0, h, w);
            const auto pos = static_cast<std::int32_t>(h * xs.w + w);
            for (std::int64_t c = 0; c < C; ++c) {
              const float v = px[c * xc];
              if (v > py[c * yc] || std::isnan(v)) {  // PyTorch's rule: first max wins, NaN propagates
                py[c * yc] = v;
                if (pa) pa[c * ic] = pos;
              }
            }
          }
      } else {
        for (std::int64_t c = 0; c < C; ++c) py[c * yc] = 0.0f;
        for (std::int64_t h = win.h0; h < win.h1; ++h)
          for (std::int64_t w = win.w0; w < win.w1; ++w) {
            const float* px = X + x.desc.offset(n, 0, h, w);
            for (std::int64_t c = 0; c < C; ++c) py[c * yc] += px[c * xc];
          }
        for (std::int64_t c = 0; c < C; ++c) py[c * yc] *= win.inv_count;
      }
    });
  });
}

void pool_backward(const Tensor& dy, const Tensor& dx, const PoolParams& p, float beta, const std::int32_t* argmax) {
  check_f32(dy, "pooling backward");
  const Shape &xs = dx.shape(), &ys = dy.shape();
  const std::int64_t C = xs.c;
  const float* DY = dy.as<float>();
  float* DX = dx.as<float>();
  const Strides idx = dense_strides(ys, dy.desc.layout);
  SB_CHECK(p.kind != PoolKind::max || argmax, "max pool backward needs the forward's argmax");
  dispatch_layout(dx, [&](auto cl) {
    constexpr bool CL = decltype(cl)::value;
    const std::int64_t dyc = cstride<CL>(dy), dxc = cstride<CL>(dx), ic = CL ? 1 : idx.c;
    // Gather: every input pixel sums the outputs whose windows cover it (no write conflicts).
    for_each_pixel(xs, [&](std::int64_t n, std::int64_t h, std::int64_t w) {
      float* pdx = DX + dx.desc.offset(n, 0, h, w);
      for (std::int64_t c = 0; c < C; ++c) pdx[c * dxc] = beta == 0.0f ? 0.0f : beta * pdx[c * dxc];
      std::int64_t oh0, oh1, ow0, ow1;
      covering(h, p.kh, p.stride_h, p.pad_h, ys.h, oh0, oh1);
      covering(w, p.kw, p.stride_w, p.pad_w, ys.w, ow0, ow1);
      const auto pos = static_cast<std::int32_t>(h * xs.w + w);
      for (std::int64_t oh = oh0; oh < oh1; ++oh)
        for (std::int64_t ow = ow0; ow < ow1; ++ow) {
          const float* pdy = DY + dy.desc.offset(n, 0, oh, ow);
          if (p.kind == PoolKind::max) {
            const std::int32_t* pa = argmax + n * idx.n + oh * idx.h + ow * idx.w;
            for (std::int64_t c = 0; c < C; ++c)
              pdx[c * dxc] += pa[c * ic] == pos ? pdy[c * dyc] : 0.0f;
          } else {
            const float k = pool_window(p, xs, oh, ow).inv_count;
            for (std::int64_t c = 0; c < C; ++c) pdx[c * dxc] += k * pdy[c * dyc];
          }
        }
    });
  });
}

// ---- elementwise ---------------------------------------------------------------------------------
namespace {
// body(const float* a, const float* b, float* out, c-strides...) over pixels; the three tensors
// share one shape and layout.
template <class F>
void zip3(const Tensor& a, const Tensor& b, const Tensor& out, F&& f) {
  const std::int64_t C = out.shape().c;
  dispatch_layout(out, [&](auto cl) {
    constexpr bool CL = decltype(cl)::value;
    const std::int64_t ac = cstride<CL>(a), bc = cstride<CL>(b), oc = cstride<CL>(out);
    for_each_pixel(out.shape(), [&](std::int64_t n, std::int64_t h, std::int64_t w) {
      const float* pa = a.as<float>() + a.desc.offset(n, 0, h, w);
      const float* pb = b.as<float>() + b.desc.offset(n, 0, h, w);
      float* po = out.as<float>() + out.desc.offset(n, 0, h, w);
      for (std::int64_t c = 0; c < C; ++c) po[c * oc] = f(pa[c * ac], pb[c * bc], po[c * oc]);
    });
  });
}
}  // namespace

void relu_forward(const Tensor& x, const Tensor& y) {
  check_f32(x, "relu");
  zip3(x, x, y, [](float a, float, float) { return std::max(a, 0.0f); });
}

void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, float beta) {
  check_f32(y, "relu backward");
  zip3(y, dy, dx, [beta](float yv, float g, float o) {
    const float v = yv > 0.0f ? g : 0.0f;
    return beta == 0.0f ? v : v + beta * o;
  });
}

void add(const Tensor& src, const Tensor& dst, float beta) {
  check_f32(src, "add");
  SB_CHECK(src.shape() == dst.shape(), "add: shapes differ");
  zip3(src, src, dst, [beta](float s, float, float o) { return beta == 0.0f ? s : s + beta * o; });
}

namespace {
inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

void dropout_forward(const Tensor& x, const Tensor& y, std::uint8_t* mask, double p, std::uint64_t seed,
                     std::uint64_t step) {
  check_f32(x, "dropout");
  SB_CHECK(x.desc.is_dense() && y.desc.is_dense(), "dropout takes dense tensors");
  const auto n = x.desc.numel();
  const float* X = x.as<float>();
  float* Y = y.as<float>();
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p));
  const std::uint64_t key = splitmix64(seed ^ splitmix64(step));
  // keep when the element's 24-bit uniform is >= p
  const auto threshold = static_cast<std::uint32_t>(p * 16777216.0);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::uint32_t>(splitmix64(key + static_cast<std::uint64_t>(i)) >> 40);
    const std::uint8_t keep = u >= threshold;
    mask[i] = keep;
    Y[i] = keep ? X[i] * keep_scale : 0.0f;
  }
}

void dropout_backward(const Tensor& dy, const Tensor& dx, float beta, const std::uint8_t* mask, double p) {
  SB_CHECK(dy.desc.is_dense() && dx.desc.is_dense(), "dropout takes dense tensors");
  const auto n = dy.desc.numel();
  const float* DY = dy.as<float>();
  float* DX = dx.as<float>();
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = mask[i] ? DY[i] * keep_scale : 0.0f;
    DX[i] = beta == 0.0f ? v : v + beta * DX[i];
  }
}

void softmax_xent_forward(const Tensor& logits, const std::int32_t* labels, float* loss, float* probs) {
  check_f32(logits, "softmax cross-entropy");
  SB_CHECK(logits.desc.is_dense() && logits.shape().h == 1 && logits.shape().w == 1,
           "softmax cross-entropy takes dense N x M logits");
  const std::int64_t N = logits.shape().n, M = logits.shape().c;
  for (std::int64_t i = 0; i < N; ++i)
    if (labels[i] < 0 || labels[i] >= M)
      throw UsageError(fmt::format("label {} of sample {} is outside [0, {}): the labels do not fit the model's "
                                   "number of classes",
                                   labels[i], i, M));
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (std::int64_t i = 0; i < N; ++i) {
    const float* z = logits.as<float>() + i * M;
    float* pr = probs + i * M;
    float mx = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < M; ++j) mx = std::max(mx, z[j]);
    double sum = 0;
    for (std::int64_t j = 0; j < M; ++j) {
      pr[j] = std::exp(z[j] - mx);
      sum += pr[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (std::int64_t j = 0; j < M; ++j) pr[j] *= inv;
    total += std::log(sum) + mx - z[labels[i]];
  }
  *loss = static_cast<float>(total / static_cast<double>(N));
}

void softmax_xent_backward(const std::int32_t* labels, const Tensor& dlogits, float scale, float beta,
                           const float* probs) {
  const std::int64_t N = dlogits.shape().n, M = dlogits.shape().c;
  const float k = scale / static_cast<float>(N);
  float* D = dlogits.as<float>();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t j = 0; j < M; ++j) {
      const float v = k * (probs[i * M + j] - (j == labels[i] ? 1.0f : 0.0f));
      D[i * M + j] = beta == 0.0f ? v : v + beta * D[i * M + j];
    }
}

void optimizer_update(const OptimizerConfig& cfg, float* params, const float* grads, float* s0, float* s1,
                      std::size_t n, float inv_scale) {
  const float is = inv_scale;
  const float lr = cfg.lr, wd = cfg.weight_decay, mu = cfg.momentum, rho = cfg.rms_decay, eps = cfg.epsilon;
  const auto N = static_cast<std::int64_t>(n);
  switch (cfg.kind) {
    case OptimizerKind::sgd:
#pragma omp parallel for simd schedule(static)
      for (std::int64_t i = 0; i < N; ++i) params[i] -= lr * (grads[i] * is + wd * params[i]);
      break;
    case OptimizerKind::momentum:  // PyTorch's SGD(momentum): buf = mu * buf + g; p -= lr * buf
#pragma omp parallel for simd schedule(static)
      for (std::int64_t i = 0; i < N; ++i) {
        const float g = grads[i] * is + wd * params[i];
        s0[i] = mu * s0[i] + g;
        params[i] -= lr * s0[i];
      }
      break;
    case OptimizerKind::rmsprop:  // TensorFlow's RMSProp, as the Inception recipe uses it
#pragma omp parallel for simd schedule(static)
      for (std::int64_t i = 0; i < N; ++i) {
        const float g = grads[i] * is + wd * params[i];
        s0[i] = rho * s0[i] + (1.0f - rho) * g * g;
        s1[i] = mu * s1[i] + lr * g / std::sqrt(s0[i] + eps);
        params[i] -= s1[i];
      }
      break;
  }
}

void scale(float* x, float alpha, std::size_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) x[i] *= alpha;
}

void fill(float* x, float v, std::size_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) x[i] = v;
}

}  // namespace stepbench::cpu
