// Max and average pooling on hand-written kernels. Max pooling keeps the argmax (storage order of
// the output; the input pixel h * W + w in its plane) for backward. No two threads write one value:
// max backward scatters per plane (NCHW) or per image and block of channels (NHWC), NHWC average
// backward gathers per input pixel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "backend/cpu/common.hpp"
#include "backend/cpu/isa.hpp"

STEPBENCH_CPU_ISA_BEGIN
#include "backend/cpu/loops.hpp"  // after BEGIN: its loops are built for this file's set

namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS {
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
  const std::int64_t count = p.kind == PoolKind::avg_exclude_pad ? (win.h1 - win.h0) * (win.w1 - win.w0) : padded;
  win.inv_count = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
  return win;
}
// Range of outputs whose window covers input index i: o*s - pad <= i < o*s - pad + k.
inline void covering(std::int64_t i, int k, int s, int pad, std::int64_t out, std::int64_t& o0, std::int64_t& o1) {
  const std::int64_t num = i + pad - k + 1;
  if (s == 1) {  // no divisions (the block average pools: per input pixel, twice)
    o0 = std::max<std::int64_t>(num, 0);
    o1 = std::min<std::int64_t>(i + pad + 1, out);
    return;
  }
  o0 = num <= 0 ? 0 : (num + s - 1) / s;
  o1 = std::min<std::int64_t>((i + pad) / s + 1, out);
}
// Average pools: every output's 1 / divisor, in output order (oh * OW + ow); fixed by the shapes.
std::vector<float> inverse_counts(const PoolParams& p, const Shape& xs, const Shape& ys) {
  std::vector<float> inv;
  if (p.kind == PoolKind::max) return inv;
  inv.resize(static_cast<std::size_t>(ys.h * ys.w));
  for (std::int64_t oh = 0; oh < ys.h; ++oh)
    for (std::int64_t ow = 0; ow < ys.w; ++ow) inv[oh * ys.w + ow] = pool_window(p, xs, oh, ow).inv_count;
  return inv;
}

// NCHW: per output row (n, c, oh). The outputs whose windows lie inside the row horizontally are
// vectorised along ow (each lane visits its window in the scalar loop's order, h then w, so ties come
// out the same); the few at the borders (padding), and rows with fewer than two such outputs (a
// global pool), take the scalar loop, which sums an average window's rows as vectors.
void pool_forward_nchw(const Tensor& x, const Tensor& y, const PoolParams& p, std::int32_t* argmax) {
  const Shape &xs = x.shape(), &ys = y.shape();
  const Strides idx = dense_strides(ys, Layout::nchw);  // argmax storage order
  const std::int64_t W = xs.w, sw = p.stride_w, pw = p.pad_w;
  const std::int64_t lo = std::min<std::int64_t>((pw + sw - 1) / sw, ys.w);  // first ow with ow*sw - pw >= 0
  const std::int64_t hi = W + pw - p.kw < 0 ? 0 : std::min<std::int64_t>((W + pw - p.kw) / sw + 1, ys.w);
  const bool max = p.kind == PoolKind::max;
  for_each_nchw_row(ys, [&](std::int64_t n, std::int64_t c, std::int64_t oh) {
    const float* X = x.as<float>() + x.desc.offset(n, c, 0, 0);
    const std::int64_t xh = x.desc.strides.h;
    float* __restrict py = y.as<float>() + y.desc.offset(n, c, oh, 0);
    std::int32_t* __restrict pa = argmax ? argmax + n * idx.n + c * idx.c + oh * idx.h : nullptr;
    auto scalar = [&](std::int64_t ow) {
      const Window win = pool_window(p, xs, oh, ow);
      if (max) {
        float m = -std::numeric_limits<float>::infinity();
        auto at = static_cast<std::int32_t>(win.h0 * W + win.w0);
        for (std::int64_t h = win.h0; h < win.h1; ++h)
          for (std::int64_t w = win.w0; w < win.w1; ++w) {
            const float v = X[h * xh + w];
            if (v > m || std::isnan(v)) {  // PyTorch's rule: first max wins, NaN propagates
              m = v;
              at = static_cast<std::int32_t>(h * W + w);
            }
          }
        py[ow] = m;
        if (pa) pa[ow] = at;
      } else {
        float sum = 0.0f;  // each window row summed as a vector (the global pool: 8 wide), rows in order
        for (std::int64_t h = win.h0; h < win.h1; ++h) {
          float r = 0.0f;
#pragma omp simd reduction(+ : r)
          for (std::int64_t w = win.w0; w < win.w1; ++w) r += X[h * xh + w];
          sum += r;
        }
        py[ow] = sum * win.inv_count;
      }
    };
    if (hi - lo < 2) {  // one window or none inside the row (a global pool): no vector of outputs
      for (std::int64_t ow = 0; ow < ys.w; ++ow) scalar(ow);
      return;
    }
    for (std::int64_t ow = 0; ow < lo; ++ow) scalar(ow);
    for (std::int64_t ow = hi; ow < ys.w; ++ow) scalar(ow);
    const Window win = pool_window(p, xs, oh, lo);  // the rows and divisor every inner window shares
    if (max) {
      const auto first = static_cast<std::int32_t>(win.h0 * W - pw);
      for (std::int64_t ow = lo; ow < hi; ++ow) {
        py[ow] = -std::numeric_limits<float>::infinity();
        if (pa) pa[ow] = first + static_cast<std::int32_t>(ow * sw);
      }
    } else {
      for (std::int64_t ow = lo; ow < hi; ++ow) py[ow] = 0.0f;
    }
    for (std::int64_t h = win.h0; h < win.h1; ++h)
      for (std::int64_t j = 0; j < p.kw; ++j) {
        // r[(ow - lo) * sw]: this window column of output ow (lo * sw - pw >= 0: inside the row)
        const float* __restrict r = X + h * xh + lo * sw - pw + j;
        const auto pos = static_cast<std::int32_t>(h * W + j - pw);
        if (!max) {
#pragma omp simd
          for (std::int64_t ow = lo; ow < hi; ++ow) py[ow] += r[(ow - lo) * sw];
        } else if (pa) {
#pragma omp simd
          for (std::int64_t ow = lo; ow < hi; ++ow) {
            const float v = r[(ow - lo) * sw], m = py[ow];
            const bool take = v > m || v != v;
            py[ow] = take ? v : m;
            pa[ow] = take ? pos + static_cast<std::int32_t>(ow * sw) : pa[ow];
          }
        } else {
#pragma omp simd
          for (std::int64_t ow = lo; ow < hi; ++ow) {
            const float v = r[(ow - lo) * sw], m = py[ow];
            py[ow] = v > m || v != v ? v : m;
          }
        }
      }
    if (!max)
      for (std::int64_t ow = lo; ow < hi; ++ow) py[ow] *= win.inv_count;
  });
}

// NHWC: per output pixel, along the contiguous channels (vectorised: selects, no branches).
void pool_forward_nhwc(const Tensor& x, const Tensor& y, const PoolParams& p, std::int32_t* argmax) {
  const Shape &xs = x.shape(), &ys = y.shape();
  const std::int64_t C = xs.c;
  const Strides idx = dense_strides(ys, Layout::nhwc);  // argmax storage order
  for_each_pixel(ys, [&](std::int64_t n, std::int64_t oh, std::int64_t ow) {
    const Window win = pool_window(p, xs, oh, ow);
    float* __restrict py = y.as<float>() + y.desc.offset(n, 0, oh, ow);
    if (p.kind == PoolKind::max) {
      std::int32_t* __restrict pa = argmax ? argmax + n * idx.n + oh * idx.h + ow * idx.w : nullptr;
      const auto first = static_cast<std::int32_t>(win.h0 * xs.w + win.w0);
      for (std::int64_t c = 0; c < C; ++c) py[c] = -std::numeric_limits<float>::infinity();
      if (pa)
        for (std::int64_t c = 0; c < C; ++c) pa[c] = first;
      for (std::int64_t h = win.h0; h < win.h1; ++h)
        for (std::int64_t w = win.w0; w < win.w1; ++w) {
          const float* __restrict px = x.as<float>() + x.desc.offset(n, 0, h, w);
          const auto pos = static_cast<std::int32_t>(h * xs.w + w);
          if (pa) {
#pragma omp simd
            for (std::int64_t c = 0; c < C; ++c) {
              const float v = px[c], m = py[c];
              const bool take = v > m || v != v;  // PyTorch's rule: first max wins, NaN propagates
              py[c] = take ? v : m;
              pa[c] = take ? pos : pa[c];
            }
          } else {
#pragma omp simd
            for (std::int64_t c = 0; c < C; ++c) {
              const float v = px[c], m = py[c];
              py[c] = v > m || v != v ? v : m;
            }
          }
        }
    } else {
      for (std::int64_t c = 0; c < C; ++c) py[c] = 0.0f;
      for (std::int64_t h = win.h0; h < win.h1; ++h)
        for (std::int64_t w = win.w0; w < win.w1; ++w) {
          const float* __restrict px = x.as<float>() + x.desc.offset(n, 0, h, w);
#pragma omp simd
          for (std::int64_t c = 0; c < C; ++c) py[c] += px[c];
        }
      for (std::int64_t c = 0; c < C; ++c) py[c] *= win.inv_count;
    }
  });
}

void pool_forward(const Tensor& x, const Tensor& y, const PoolParams& p, std::int32_t* argmax) {
  check_f32(x, "pooling");
  if (x.desc.layout == Layout::nchw)
    pool_forward_nchw(x, y, p, argmax);
  else
    pool_forward_nhwc(x, y, p, argmax);
}

// NCHW: per plane (n, c), one thread scatters every output's gradient into its window (max: into
// its argmax), in output order: each input pixel sums its outputs in the order the NHWC gather does.
// Average pools of stride 1 along w scatter a whole output row at a time: its scaled gradients, added
// to each window row's pixels by one contiguous pass per window column, from the last column to the
// first, so that every pixel still receives its outputs in output order.
void pool_backward_nchw(const Tensor& dy, const Tensor& dx, const PoolParams& p, float beta, const std::int32_t* argmax,
                        const float* inv) {
  const Shape &xs = dx.shape(), &ys = dy.shape();
  const Strides idx = dense_strides(ys, Layout::nchw);
#pragma omp parallel
  {
    std::vector<float> grow(p.kind == PoolKind::max ? 0 : static_cast<std::size_t>(ys.w));
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t n = 0; n < xs.n; ++n)
      for (std::int64_t c = 0; c < xs.c; ++c) {
        float* DX = dx.as<float>() + dx.desc.offset(n, c, 0, 0);
        const std::int64_t xh = dx.desc.strides.h;
        for (std::int64_t h = 0; h < xs.h; ++h) {
          float* __restrict d = DX + h * xh;
          if (beta == 0.0f)
            std::fill(d, d + xs.w, 0.0f);
          else
#pragma omp simd
            for (std::int64_t w = 0; w < xs.w; ++w) d[w] *= beta;
        }
        for (std::int64_t oh = 0; oh < ys.h; ++oh) {
          const float* pdy = dy.as<float>() + dy.desc.offset(n, c, oh, 0);
          const float* io = inv + oh * ys.w;
          if (p.kind == PoolKind::max) {
            const std::int32_t* pa = argmax + n * idx.n + c * idx.c + oh * idx.h;
            for (std::int64_t ow = 0; ow < ys.w; ++ow) DX[pa[ow] / xs.w * xh + pa[ow] % xs.w] += pdy[ow];
          } else if (p.stride_w == 1) {
            float* __restrict g = grow.data();
#pragma omp simd
            for (std::int64_t ow = 0; ow < ys.w; ++ow) g[ow] = io[ow] * pdy[ow];
            const std::int64_t hs = oh * p.stride_h - p.pad_h;
            for (std::int64_t h = std::max<std::int64_t>(hs, 0); h < std::min<std::int64_t>(hs + p.kh, xs.h); ++h)
              for (std::int64_t j = p.kw - 1; j >= 0; --j) {
                // outputs ow whose column j is the pixel ow - pad + j of the row
                const std::int64_t ow0 = std::max<std::int64_t>(0, p.pad_w - j),
                                   ow1 = std::min<std::int64_t>(ys.w, xs.w + p.pad_w - j);
                float* __restrict d = DX + h * xh + (ow0 - p.pad_w + j);
                const float* __restrict gr = g + ow0;
#pragma omp simd
                for (std::int64_t k = 0; k < ow1 - ow0; ++k) d[k] += gr[k];
              }
          } else {
            for (std::int64_t ow = 0; ow < ys.w; ++ow) {
              const Window win = pool_window(p, xs, oh, ow);
              const float g = io[ow] * pdy[ow];
              for (std::int64_t h = win.h0; h < win.h1; ++h)
                for (std::int64_t w = win.w0; w < win.w1; ++w) DX[h * xh + w] += g;
            }
          }
        }
      }
  }
}

void pool_backward(const Tensor& dy, const Tensor& dx, const PoolParams& p, float beta, const std::int32_t* argmax,
                   const float* inv) {
  check_f32(dy, "pooling backward");
  SB_CHECK(p.kind != PoolKind::max || argmax, "max pool backward needs the forward's argmax");
  if (dx.desc.layout == Layout::nchw) {
    pool_backward_nchw(dy, dx, p, beta, argmax, inv);
    return;
  }
  const Shape &xs = dx.shape(), &ys = dy.shape();
  const std::int64_t C = xs.c;
  const Strides idx = dense_strides(ys, Layout::nhwc);
  if (p.kind == PoolKind::max) {
    // NHWC max: scatter each output's gradient to its argmax, in parallel over images and blocks of
    // channels (one thread per block: no conflicts), outputs in order as the gather sums them. The
    // gather compared every covering output's argmax for every input pixel: 2-4x PyTorch's backward.
    constexpr std::int64_t kBlock = 64;
    const std::int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) schedule(static)
    for (std::int64_t n = 0; n < xs.n; ++n)
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t c0 = b * kBlock, c1 = std::min(C, c0 + kBlock);
        for (std::int64_t h = 0; h < xs.h; ++h)
          for (std::int64_t w = 0; w < xs.w; ++w) {
            float* pdx = dx.as<float>() + dx.desc.offset(n, 0, h, w);
            for (std::int64_t c = c0; c < c1; ++c) pdx[c] = beta == 0.0f ? 0.0f : beta * pdx[c];
          }
        float* DX = dx.as<float>() + dx.desc.offset(n, 0, 0, 0);
        const std::int64_t xh = dx.desc.strides.h, xw = dx.desc.strides.w;
        for (std::int64_t oh = 0; oh < ys.h; ++oh)
          for (std::int64_t ow = 0; ow < ys.w; ++ow) {
            const float* pdy = dy.as<float>() + dy.desc.offset(n, 0, oh, ow);
            const std::int32_t* pa = argmax + n * idx.n + oh * idx.h + ow * idx.w;
            for (std::int64_t c = c0; c < c1; ++c) DX[pa[c] / xs.w * xh + pa[c] % xs.w * xw + c] += pdy[c];
          }
      }
    return;
  }
  // NHWC average: gather: every input pixel sums the outputs whose windows cover it (no write
  // conflicts), along the contiguous channels.
  for_each_pixel(xs, [&](std::int64_t n, std::int64_t h, std::int64_t w) {
    float* __restrict pdx = dx.as<float>() + dx.desc.offset(n, 0, h, w);
    for (std::int64_t c = 0; c < C; ++c) pdx[c] = beta == 0.0f ? 0.0f : beta * pdx[c];
    std::int64_t oh0, oh1, ow0, ow1;
    covering(h, p.kh, p.stride_h, p.pad_h, ys.h, oh0, oh1);
    covering(w, p.kw, p.stride_w, p.pad_w, ys.w, ow0, ow1);
    for (std::int64_t oh = oh0; oh < oh1; ++oh)
      for (std::int64_t ow = ow0; ow < ow1; ++ow) {
        const float* __restrict pdy = dy.as<float>() + dy.desc.offset(n, 0, oh, ow);
        const float k = inv[oh * ys.w + ow];
#pragma omp simd
        for (std::int64_t c = 0; c < C; ++c) pdx[c] += k * pdy[c];
      }
  });
}

// dst = src element for element (one shape and layout, any strides), widening or rounding between
// fp32 and bf16.
template <class S, class D>
void convert_tensor(const Tensor& src, const Tensor& dst) {
  const Shape& s = dst.shape();
  if (dst.desc.layout == Layout::nchw) {
    for_each_nchw_row(s, [&](std::int64_t n, std::int64_t c, std::int64_t h) {
      const S* a = src.as<S>() + src.desc.offset(n, c, h, 0);
      D* b = dst.as<D>() + dst.desc.offset(n, c, h, 0);
      for (std::int64_t w = 0; w < s.w; ++w) b[w] = st<D>(ld(a[w]));
    });
    return;
  }
  for_each_pixel(s, [&](std::int64_t n, std::int64_t h, std::int64_t w) {
    const S* a = src.as<S>() + src.desc.offset(n, 0, h, w);
    D* b = dst.as<D>() + dst.desc.offset(n, 0, h, w);
    for (std::int64_t c = 0; c < s.c; ++c) b[c] = st<D>(ld(a[c]));
  });
}

// bf16 pooling runs the fp32 kernels on fp32 copies (sums and the gradient's scatter stay in fp32),
// one image at a time (pooling never mixes images), staged in one buffer per thread that the first
// step grows to the largest pool's image and keeps: one image's input and output in fp32 (ResNet-50's
// first max pool: 3.2 MiB), whatever the batch.
float* staging(std::size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

// Image n of t: the same strides, one image.
Tensor image(const Tensor& t, std::int64_t n) {
  Tensor v = t;
  v.data = static_cast<char*>(t.data) + n * t.desc.strides.n * static_cast<std::int64_t>(dtype_size(t.desc.dtype));
  v.desc.shape.n = 1;
  return v;
}

class CpuPool final : public PoolOp {
 public:
  CpuPool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p)
      : p_(p), x_(x), y_(y), inv_(inverse_counts(p, x.shape, y.shape)) {
    if (x.dtype != DType::f32 && x.dtype != DType::bf16)
      throw UnsupportedError("pooling: the cpu backend computes in fp32 or bf16");
    SB_CHECK(pool_output_shape(x.shape, p) == y.shape, "pool output shape mismatch");
  }
  std::size_t reserve_bytes() const override {
    return p_.kind == PoolKind::max ? static_cast<std::size_t>(y_.numel()) * sizeof(std::int32_t) : 0;
  }
  void forward(Stream&, const Tensor& x, const Tensor& y, void* reserve) override {
    check_cpu_dtype(x, "pooling");
    if (x.desc.dtype == DType::f32) {
      pool_forward(x, y, p_, static_cast<std::int32_t*>(reserve));
      return;
    }
    Shape xs = x_.shape, ys = y_.shape;
    xs.n = ys.n = 1;
    float* buf = staging(static_cast<std::size_t>(xs.numel() + ys.numel()));
    const Tensor xf{buf, TensorDesc::dense(xs, DType::f32, x_.layout)};
    const Tensor yf{buf + xs.numel(), TensorDesc::dense(ys, DType::f32, y_.layout)};
    auto* argmax = static_cast<std::int32_t*>(reserve);  // in the output's dense order: image n at n x its size
    for (std::int64_t n = 0; n < x_.shape.n; ++n) {
      convert_tensor<bf16, float>(image(x, n), xf);
      pool_forward(xf, yf, p_, argmax ? argmax + n * ys.numel() : nullptr);
      convert_tensor<float, bf16>(yf, image(y, n));
    }
  }
  void backward(Stream&, const Tensor&, const Tensor&, const Tensor& dy, const Tensor& dx, float beta,
                const void* reserve) override {
    check_cpu_dtype(dy, "pooling backward");
    if (dy.desc.dtype == DType::f32) {
      pool_backward(dy, dx, p_, beta, static_cast<const std::int32_t*>(reserve), inv_.data());
      return;
    }
    Shape xs = x_.shape, ys = y_.shape;
    xs.n = ys.n = 1;
    float* buf = staging(static_cast<std::size_t>(xs.numel() + ys.numel()));
    const Tensor dxf{buf, TensorDesc::dense(xs, DType::f32, x_.layout)};
    const Tensor dyf{buf + xs.numel(), TensorDesc::dense(ys, DType::f32, y_.layout)};
    const auto* argmax = static_cast<const std::int32_t*>(reserve);
    for (std::int64_t n = 0; n < x_.shape.n; ++n) {
      convert_tensor<bf16, float>(image(dy, n), dyf);
      if (beta != 0.0f) convert_tensor<bf16, float>(image(dx, n), dxf);
      pool_backward(dyf, dxf, p_, beta, argmax ? argmax + n * ys.numel() : nullptr, inv_.data());
      convert_tensor<float, bf16>(dxf, image(dx, n));
    }
  }

 private:
  PoolParams p_;
  TensorDesc x_, y_;
  std::vector<float> inv_;  // average pools: inverse_counts(), made at planning
};

}  // namespace

std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) {
  return std::make_unique<CpuPool>(x, y, p);
}

}  // namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS
STEPBENCH_CPU_ISA_END
