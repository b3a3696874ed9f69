// Max and average pooling on hand-written kernels. Max pooling keeps the argmax (storage order of
// the output) for backward, which gathers per input pixel so no two threads write one value.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>

#include "backend/cpu/common.hpp"

namespace stepbench::cpu {
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
  o0 = num <= 0 ? 0 : (num + s - 1) / s;
  o1 = std::min<std::int64_t>((i + pad) / s + 1, out);
}

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
            for (std::int64_t c = 0; c < C; ++c) pdx[c * dxc] += pa[c * ic] == pos ? pdy[c * dyc] : 0.0f;
          } else {
            const float k = pool_window(p, xs, oh, ow).inv_count;
            for (std::int64_t c = 0; c < C; ++c) pdx[c * dxc] += k * pdy[c * dyc];
          }
        }
    });
  });
}

class CpuPool final : public PoolOp {
 public:
  CpuPool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) : p_(p), y_(y) {
    if (x.dtype != DType::f32) throw UnsupportedError("pooling: the cpu backend computes in fp32 only");
    SB_CHECK(pool_output_shape(x.shape, p) == y.shape, "pool output shape mismatch");
  }
  std::size_t reserve_bytes() const override {
    return p_.kind == PoolKind::max ? static_cast<std::size_t>(y_.numel()) * sizeof(std::int32_t) : 0;
  }
  void forward(Stream&, const Tensor& x, const Tensor& y, void* reserve) override {
    pool_forward(x, y, p_, static_cast<std::int32_t*>(reserve));
  }
  void backward(Stream&, const Tensor&, const Tensor&, const Tensor& dy, const Tensor& dx, float beta,
                const void* reserve) override {
    pool_backward(dy, dx, p_, beta, static_cast<const std::int32_t*>(reserve));
  }

 private:
  PoolParams p_;
  TensorDesc y_;
};

}  // namespace

std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) {
  return std::make_unique<CpuPool>(x, y, p);
}

}  // namespace stepbench::cpu
