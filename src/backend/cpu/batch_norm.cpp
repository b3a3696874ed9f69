// Batch normalisation (with the fused ReLU of conv_bn_relu) on hand-written kernels: batch
// statistics in two passes with double accumulators, then one affine pass (none where y has no data:
// a fused unit's statistics, backend/fused.hpp); any strides, so channel slices of a concat work in place.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cpu/common.hpp"
#include "backend/cpu/isa.hpp"

STEPBENCH_CPU_ISA_BEGIN
#include "backend/cpu/loops.hpp"  // after BEGIN: its loops are built for this file's set

namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS {
namespace {

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

// The training forward's affine factors of one channel, y = a x + b, from what it saves (the mean
// and 1/sqrt(var + eps), rounded to float): the recompute (forward_recompute) derives the same ones.
std::pair<float, float> scale_shift(float gamma, float beta, float mean, float invstd) {
  const double gi = static_cast<double>(gamma) * invstd;
  return {static_cast<float>(gi), static_cast<float>(beta - mean * gi)};
}

// y = relu?(a[c] * x + b[c]): channel-contiguous per pixel for NHWC, plane by plane for NCHW (each
// (n, c) row of w is contiguous even in a channel slice), so both layouts stream through memory.
template <class T>
void affine_per_channel(const Tensor& x, const Tensor& y, const float* a, const float* b, bool relu) {
  const Shape& s = x.shape();
  const std::int64_t C = s.c;
  const T* X = x.as<T>();
  T* Y = y.as<T>();
  if (x.desc.layout == Layout::nhwc) {
    for_each_pixel(s, [&](std::int64_t n, std::int64_t h, std::int64_t w) {
      const T* px = X + x.desc.offset(n, 0, h, w);
      T* py = Y + y.desc.offset(n, 0, h, w);
      if (relu) {
        for (std::int64_t c = 0; c < C; ++c) py[c] = st<T>(std::max(a[c] * ld(px[c]) + b[c], 0.0f));
      } else {
        for (std::int64_t c = 0; c < C; ++c) py[c] = st<T>(a[c] * ld(px[c]) + b[c]);
      }
    });
    return;
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const float ac = a[c], bc = b[c];
      for (std::int64_t h = 0; h < s.h; ++h) {
        const T* px = X + x.desc.offset(n, c, h, 0);
        T* py = Y + y.desc.offset(n, c, h, 0);
        if (relu) {
          for (std::int64_t w = 0; w < s.w; ++w) py[w] = st<T>(std::max(ac * ld(px[w]) + bc, 0.0f));
        } else {
          for (std::int64_t w = 0; w < s.w; ++w) py[w] = st<T>(ac * ld(px[w]) + bc);
        }
      }
    }
}

// scratch: at least bn_scratch_doubles(C) doubles, reused across calls (channels-last backward: per
// thread 2C double accumulators and 2C float partials, then 2C double totals and 3C float factors).
std::size_t bn_scratch_doubles(std::int64_t channels) {
  return static_cast<std::size_t>(omp_get_max_threads() + 2) * channels * 3;
}

// A channels-last row (pixel r of the N x H x W pixels): C contiguous channels, also in a slice.
template <class T>
inline T* nhwc_row(const Tensor& t, std::int64_t r, std::int64_t hw, std::int64_t w) {
  return t.as<T>() + t.desc.offset(r / hw, 0, (r % hw) / w, (r % hw) % w);
}

// Channels-last backward over rows, vectorised along the channels. Pass 1: per channel the sums of
// g = dy (masked by the fused ReLU) and of g * (x - mean), in float over blocks of kRows rows, folded
// into per-thread double accumulators. Pass 2: dx. The generic per-pixel loop (interleaved double
// accumulators, a branch per element) made BN backward 11-18x its forward on Inception's layers.
template <class E, bool Relu>
void bn_backward_nhwc(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* mean,
                      const float* k1, const float* k2, const float* k3, double* totals, double* scratch, bool sums,
                      float beta_dx) {
  constexpr std::int64_t kRows = 64;
  const Shape& s = x.shape();
  const std::int64_t C = s.c, HW = s.h * s.w, R = s.n * HW;
  if (sums) {
    const int T = omp_get_max_threads();
#pragma omp parallel num_threads(T)
    {
      double* dg = scratch + static_cast<std::size_t>(omp_get_thread_num()) * C * 3;
      double* dgx = dg + C;
      float* __restrict fg = reinterpret_cast<float*>(dgx + C);
      float* __restrict fgx = fg + C;
      std::fill(dg, dg + 2 * C, 0.0);
#pragma omp for schedule(static)
      for (std::int64_t b = 0; b < (R + kRows - 1) / kRows; ++b) {
        std::fill(fg, fg + 2 * C, 0.0f);
        for (std::int64_t r = b * kRows; r < std::min(R, (b + 1) * kRows); ++r) {
          const E* __restrict px = nhwc_row<E>(x, r, HW, s.w);
          const E* __restrict py = nhwc_row<E>(y, r, HW, s.w);
          const E* __restrict pdy = nhwc_row<E>(dy, r, HW, s.w);
#pragma omp simd
          for (std::int64_t c = 0; c < C; ++c) {
            const float d = ld(pdy[c]), g = Relu ? (ld(py[c]) > 0.0f ? d : 0.0f) : d;  // loads first: a select
            fg[c] += g;
            fgx[c] += g * (ld(px[c]) - mean[c]);
          }
        }
        for (std::int64_t c = 0; c < C; ++c) {
          dg[c] += fg[c];
          dgx[c] += fgx[c];
        }
      }
    }
    std::fill(totals, totals + 2 * C, 0.0);
    for (int t = 0; t < T; ++t)
      for (std::int64_t i = 0; i < 2 * C; ++i) totals[i] += scratch[static_cast<std::size_t>(t) * C * 3 + i];
    return;
  }
  auto apply = [&](auto accumulate) {
    constexpr bool Acc = decltype(accumulate)::value;
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < R; ++r) {
      const E* __restrict px = nhwc_row<E>(x, r, HW, s.w);
      const E* __restrict py = nhwc_row<E>(y, r, HW, s.w);
      const E* __restrict pdy = nhwc_row<E>(dy, r, HW, s.w);
      E* __restrict pdx = nhwc_row<E>(dx, r, HW, s.w);
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) {
        const float d = ld(pdy[c]), g = Relu ? (ld(py[c]) > 0.0f ? d : 0.0f) : d;  // loads first: a select
        const float v = k1[c] * (g - k2[c] - (ld(px[c]) - mean[c]) * k3[c]);
        pdx[c] = st<E>(Acc ? v + beta_dx * ld(pdx[c]) : v);  // beta 0 never reads dx
      }
    }
  };
  beta_dx == 0.0f ? apply(std::false_type{}) : apply(std::true_type{});
}

// NCHW, parallel over channels: each thread owns whole channels, whose (n, h) rows of w values are contiguous (also
// in a channel slice), so a channel's passes run back to back while its planes are in cache, with no cross-thread
// reduction. Sums in double, vectorised along w (float row sums overflowed on huge activations, changing which
// parameter goes non-finite first). The per-pixel loop it replaces made NCHW 2x (forward) and 6x (backward) NHWC's.
template <class Row>
double sum_over_rows(const Shape& s, Row&& row) {  // row(n, h): one row's sum
  double total = 0.0;
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t h = 0; h < s.h; ++h) total += row(n, h);
  return total;
}

// y = relu?(a x + b) over channel c's planes, from the factors scale_shift gives: the training
// forward's pass and the recompute's, one code so that they agree bit for bit.
template <class T>
void apply_channel_nchw(const Tensor& x, const Tensor& y, std::int64_t c, std::pair<float, float> ab, bool relu) {
  const Shape& s = x.shape();
  const float a = ab.first, b = ab.second;  // not a structured binding: OpenMP regions cannot capture one
  const float lo = relu ? 0.0f : -std::numeric_limits<float>::infinity();  // the fused ReLU, or none
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t h = 0; h < s.h; ++h) {
      const T* px = x.as<T>() + x.desc.offset(n, c, h, 0);
      T* py = y.as<T>() + y.desc.offset(n, c, h, 0);
#pragma omp simd
      for (std::int64_t w = 0; w < s.w; ++w) py[w] = st<T>(std::max(a * ld(px[w]) + b, lo));  // NaN stays NaN
    }
}

template <class T>
void bn_forward_training_nchw(const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                              float* running_mean, float* running_var, float* save_mean, float* save_invstd,
                              const BatchNormParams& p) {
  const Shape& s = x.shape();
  const double M = static_cast<double>(s.n * s.h * s.w);
  const std::int64_t W = s.w;
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < s.c; ++c) {
    auto xrow = [&](std::int64_t n, std::int64_t h) { return x.as<T>() + x.desc.offset(n, c, h, 0); };
    const double mean = sum_over_rows(s,
                                      [&](std::int64_t n, std::int64_t h) {
                                        const T* px = xrow(n, h);
                                        double r = 0.0;
#pragma omp simd reduction(+ : r)
                                        for (std::int64_t w = 0; w < W; ++w) r += ld(px[w]);
                                        return r;
                                      }) /
                        M;
    const auto mf = static_cast<float>(mean);
    // around the float mean the row values are computed from (two passes: no cancellation)
    const double var = sum_over_rows(s,
                                     [&](std::int64_t n, std::int64_t h) {
                                       const T* px = xrow(n, h);
                                       double r = 0.0;
                                       const std::int64_t end = W - planted_skip(y, s, n, h, W - 1);
#pragma omp simd reduction(+ : r)
                                       for (std::int64_t w = 0; w < end; ++w) {
                                         const double d = ld(px[w]) - mf;  // squared in double: no overflow
                                         r += d * d;
                                       }
                                       return r;
                                     }) /
                       M;
    save_mean[c] = mf;
    save_invstd[c] = static_cast<float>(1.0 / std::sqrt(var + p.eps));
    const double unbiased = M > 1 ? var * M / (M - 1) : var;
    running_mean[c] = static_cast<float>((1 - p.momentum) * running_mean[c] + p.momentum * mf);
    running_var[c] = static_cast<float>((1 - p.momentum) * running_var[c] + p.momentum * unbiased);
    if (y.data) apply_channel_nchw<T>(x, y, c, scale_shift(gamma[c], beta[c], mf, save_invstd[c]), p.relu);
  }
}

template <class T, bool Relu, bool Acc>
void bn_backward_nchw(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* gamma,
                      const float* save_mean, const float* save_invstd, float* dgamma, float* dbeta, float beta_dx) {
  const Shape& s = x.shape();
  const double M = static_cast<double>(s.n * s.h * s.w);
  const std::int64_t W = s.w;
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < s.c; ++c) {
    const float mean = save_mean[c];
    double sg = 0.0, sgx = 0.0;  // sum of g = dy (masked by the fused ReLU), of g * (x - mean)
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t h = 0; h < s.h; ++h) {
        const T* px = x.as<T>() + x.desc.offset(n, c, h, 0);
        const T* py = y.as<T>() + y.desc.offset(n, c, h, 0);
        const T* pdy = dy.as<T>() + dy.desc.offset(n, c, h, 0);
        double fg = 0.0, fgx = 0.0;
#pragma omp simd reduction(+ : fg, fgx)
        for (std::int64_t w = 0; w < W; ++w) {
          // dy where y > 0 (NaN y: 0), as a bit mask: GCC leaves the select into double sums scalar
          const std::uint32_t keep = !Relu || ld(py[w]) > 0.0f ? 0xffffffffu : 0u;
          const float g = std::bit_cast<float>(std::bit_cast<std::uint32_t>(ld(pdy[w])) & keep);
          fg += g;
          fgx += g * (ld(px[w]) - mean);
        }
        sg += fg;
        sgx += fgx;
      }
    const double sgxhat = sgx * save_invstd[c];
    dbeta[c] = static_cast<float>(sg);
    dgamma[c] = static_cast<float>(sgxhat);
    // dx = gamma*invstd * (g - sum(g)/M - xhat * sum(g xhat)/M), xhat = (x - mean) * invstd
    const float k1 = gamma[c] * save_invstd[c], k2 = static_cast<float>(sg / M),
                k3 = static_cast<float>(sgxhat / M) * save_invstd[c];
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t h = 0; h < s.h; ++h) {
        const T* px = x.as<T>() + x.desc.offset(n, c, h, 0);
        const T* py = y.as<T>() + y.desc.offset(n, c, h, 0);
        const T* pdy = dy.as<T>() + dy.desc.offset(n, c, h, 0);
        T* pdx = dx.as<T>() + dx.desc.offset(n, c, h, 0);
#pragma omp simd
        for (std::int64_t w = 0; w < W; ++w) {
          const float d = ld(pdy[w]), g = Relu ? (ld(py[w]) > 0.0f ? d : 0.0f) : d;
          const float v = k1 * (g - k2 - (ld(px[w]) - mean) * k3);
          pdx[w] = st<T>(Acc ? v + beta_dx * ld(pdx[w]) : v);  // beta 0 never reads dx
        }
      }
  }
}

template <class T>
void bn_forward_training(const Tensor& x, const Tensor& y, const float* gamma, const float* beta, float* running_mean,
                         float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p,
                         double* scratch) {
  if (x.desc.layout == Layout::nchw) {
    bn_forward_training_nchw<T>(x, y, gamma, beta, running_mean, running_var, save_mean, save_invstd, p);
    return;
  }
  const Shape& s = x.shape();
  const std::int64_t C = s.c;
  const double M = static_cast<double>(s.n * s.h * s.w);
  double* totals = scratch + static_cast<std::size_t>(omp_get_max_threads()) * C * 2;
  const T* X = x.as<T>();
  dispatch_layout(x, [&](auto cl) {
    constexpr bool CL = decltype(cl)::value;
    const std::int64_t xc = cstride<CL>(x);
    // pass 1: mean
    channel_sums<CL, 1>(s, scratch, totals, [&](double* acc, std::int64_t n, std::int64_t h, std::int64_t w) {
      const T* px = X + x.desc.offset(n, 0, h, w);
      for (std::int64_t c = 0; c < C; ++c) acc[c] += ld(px[c * xc]);
    });
    for (std::int64_t c = 0; c < C; ++c) save_mean[c] = static_cast<float>(totals[c] / M);
    // pass 2: variance around the mean (two passes: no cancellation)
    channel_sums<CL, 1>(s, scratch, totals, [&](double* acc, std::int64_t n, std::int64_t h, std::int64_t w) {
      if (planted_skip(y, s, n, h, w)) return;
      const T* px = X + x.desc.offset(n, 0, h, w);
      for (std::int64_t c = 0; c < C; ++c) {
        const double d = ld(px[c * xc]) - save_mean[c];
        acc[c] += d * d;
      }
    });
  });
  float* a = reinterpret_cast<float*>(scratch);  // scratch is free again: reuse for scale/shift
  float* b = a + C;
  for (std::int64_t c = 0; c < C; ++c) {
    const double var = totals[c] / M;
    save_invstd[c] = static_cast<float>(1.0 / std::sqrt(var + p.eps));
    const double unbiased = M > 1 ? var * M / (M - 1) : var;
    running_mean[c] = static_cast<float>((1 - p.momentum) * running_mean[c] + p.momentum * save_mean[c]);
    running_var[c] = static_cast<float>((1 - p.momentum) * running_var[c] + p.momentum * unbiased);
    std::tie(a[c], b[c]) = scale_shift(gamma[c], beta[c], save_mean[c], save_invstd[c]);
  }
  if (y.data) affine_per_channel<T>(x, y, a, b, p.relu);
}

// forward_training's y from x and its saved mean and 1/sqrt(var + eps): the same factors and pass, so the same bits.
template <class T>
void bn_forward_recompute(const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                          const float* save_mean, const float* save_invstd, bool relu, double* scratch) {
  const std::int64_t C = x.shape().c;
  if (x.desc.layout == Layout::nchw) {
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < C; ++c)
      apply_channel_nchw<T>(x, y, c, scale_shift(gamma[c], beta[c], save_mean[c], save_invstd[c]), relu);
    return;
  }
  float* a = reinterpret_cast<float*>(scratch);
  float* b = a + C;
  for (std::int64_t c = 0; c < C; ++c)
    std::tie(a[c], b[c]) = scale_shift(gamma[c], beta[c], save_mean[c], save_invstd[c]);
  affine_per_channel<T>(x, y, a, b, relu);
}

template <class T>
void bn_forward_inference(const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                          const float* running_mean, const float* running_var, const BatchNormParams& p,
                          double* scratch) {
  const std::int64_t C = x.shape().c;
  float* a = reinterpret_cast<float*>(scratch);
  float* b = a + C;
  for (std::int64_t c = 0; c < C; ++c) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + p.eps);
    a[c] = static_cast<float>(gamma[c] * invstd);
    b[c] = static_cast<float>(beta[c] - running_mean[c] * gamma[c] * invstd);
  }
  affine_per_channel<T>(x, y, a, b, p.relu);
}

template <class T>
void bn_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* gamma,
                 const float* save_mean, const float* save_invstd, float* dgamma, float* dbeta, float beta_dx,
                 bool relu, double* scratch) {
  const Shape& s = x.shape();
  const std::int64_t C = s.c;
  const double M = static_cast<double>(s.n * s.h * s.w);
  if (x.desc.layout == Layout::nhwc) {
    // after the per-thread regions: tot[c] = sum g, tot[C + c] = sum g (x - mean), then k1..k3
    double* tot = scratch + static_cast<std::size_t>(omp_get_max_threads()) * C * 3;
    float* k1 = reinterpret_cast<float*>(tot + 2 * C);
    float* k2 = k1 + C;
    float* k3 = k2 + C;
    auto run = [&](auto relu_c, bool sums) {
      bn_backward_nhwc<T, decltype(relu_c)::value>(x, y, dy, dx, save_mean, k1, k2, k3, tot, scratch, sums, beta_dx);
    };
    relu ? run(std::true_type{}, true) : run(std::false_type{}, true);
    for (std::int64_t c = 0; c < C; ++c) {
      const double sg = tot[c], sgxhat = tot[C + c] * save_invstd[c];
      dbeta[c] = static_cast<float>(sg);
      dgamma[c] = static_cast<float>(sgxhat);
      // dx = gamma*invstd * (g - sum(g)/M - xhat * sum(g xhat)/M), xhat = (x - mean) * invstd
      k1[c] = gamma[c] * save_invstd[c];
      k2[c] = static_cast<float>(sg / M);
      k3[c] = static_cast<float>(sgxhat / M) * save_invstd[c];
    }
    relu ? run(std::true_type{}, false) : run(std::false_type{}, false);
    return;
  }
  auto run = [&](auto relu_c, auto acc_c) {
    bn_backward_nchw<T, decltype(relu_c)::value, decltype(acc_c)::value>(x, y, dy, dx, gamma, save_mean, save_invstd,
                                                                         dgamma, dbeta, beta_dx);
  };
  if (beta_dx == 0.0f)
    relu ? run(std::true_type{}, std::false_type{}) : run(std::false_type{}, std::false_type{});
  else
    relu ? run(std::true_type{}, std::true_type{}) : run(std::false_type{}, std::true_type{});
}

class CpuBatchNorm final : public BatchNormOp {
 public:
  // bf16 data: statistics, scale and shift in fp32 (as oneDNN's and PyTorch's bf16 batch norm)
  CpuBatchNorm(const TensorDesc& x, const BatchNormParams& p) : p_(p), scratch_(bn_scratch_doubles(x.shape.c)) {
    if (x.dtype != DType::f32 && x.dtype != DType::bf16)
      throw UnsupportedError("batch norm: the cpu backend computes in fp32 or bf16");
  }
  bool statistics_without_output() const override { return true; }
  void forward_training(Stream&, const Tensor& x, const Tensor& y, const float* gamma, const float* beta, float* rm,
                        float* rv, float* sm, float* si, void*, void*) override {
    check_cpu_dtype(x, "batch norm");
    dispatch_dtype(x.desc.dtype, [&](auto t) {
      bn_forward_training<decltype(t)>(x, y, gamma, beta, rm, rv, sm, si, p_, scratch_.data());
    });
  }
  void forward_inference(Stream&, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                         const float* rm, const float* rv, void*) override {
    check_cpu_dtype(x, "batch norm");
    dispatch_dtype(x.desc.dtype,
                   [&](auto t) { bn_forward_inference<decltype(t)>(x, y, gamma, beta, rm, rv, p_, scratch_.data()); });
  }
  void forward_recompute(Stream&, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                         const float* sm, const float* si, void*, const void*) override {
    check_cpu_dtype(x, "batch norm");
    dispatch_dtype(x.desc.dtype, [&](auto t) {
      bn_forward_recompute<decltype(t)>(x, y, gamma, beta, sm, si, p_.relu, scratch_.data());
    });
  }
  void backward(Stream&, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* gamma,
                const float*, const float* sm, const float* si, float* dgamma, float* dbeta, float beta_dx, void*,
                const void*) override {
    check_cpu_dtype(x, "batch norm backward");
    dispatch_dtype(x.desc.dtype, [&](auto t) {
      bn_backward<decltype(t)>(x, y, dy, dx, gamma, sm, si, dgamma, dbeta, beta_dx, p_.relu, scratch_.data());
    });
  }

 private:
  BatchNormParams p_;
  std::vector<double> scratch_;  // sized at planning time
};

}  // namespace

std::unique_ptr<BatchNormOp> make_batch_norm(const TensorDesc& x, const BatchNormParams& p) {
  return std::make_unique<CpuBatchNorm>(x, p);
}

}  // namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS
STEPBENCH_CPU_ISA_END
