// Elementwise ops: ReLU (the op and its kernels), and the kernels behind the backend's add, scale,
// fill and cast.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>

#include "backend/cpu/common.hpp"
#include "backend/cpu/isa.hpp"

STEPBENCH_CPU_ISA_BEGIN
#include "backend/cpu/loops.hpp"  // after BEGIN: its loops are built for this file's set

namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS {
namespace {

// out = f(a, b, out) elementwise; the three tensors share one shape, layout and element type (any
// strides of a channel slice): per pixel along the contiguous channels in NHWC, per row along w in
// NCHW. f takes and returns floats; bf16 tensors are widened and rounded around it.
template <class T, class F>
void zip3_typed(const Tensor& a, const Tensor& b, const Tensor& out, F&& f) {
  const Shape& s = out.shape();
  if (out.desc.layout == Layout::nchw) {
    for_each_nchw_row(s, [&](std::int64_t n, std::int64_t c, std::int64_t h) {
      const T* pa = a.as<T>() + a.desc.offset(n, c, h, 0);
      const T* pb = b.as<T>() + b.desc.offset(n, c, h, 0);
      T* po = out.as<T>() + out.desc.offset(n, c, h, 0);
      for (std::int64_t w = 0; w < s.w; ++w) po[w] = st<T>(f(ld(pa[w]), ld(pb[w]), ld(po[w])));
    });
    return;
  }
  for_each_pixel(s, [&](std::int64_t n, std::int64_t h, std::int64_t w) {
    const T* pa = a.as<T>() + a.desc.offset(n, 0, h, w);
    const T* pb = b.as<T>() + b.desc.offset(n, 0, h, w);
    T* po = out.as<T>() + out.desc.offset(n, 0, h, w);
    for (std::int64_t c = 0; c < s.c; ++c) po[c] = st<T>(f(ld(pa[c]), ld(pb[c]), ld(po[c])));
  });
}
template <class F>
void zip3(const Tensor& a, const Tensor& b, const Tensor& out, F&& f) {
  SB_CHECK(a.desc.dtype == out.desc.dtype && b.desc.dtype == out.desc.dtype, "elementwise: element types differ");
  dispatch_dtype(out.desc.dtype, [&](auto t) { zip3_typed<decltype(t)>(a, b, out, f); });
}

void relu_forward(const Tensor& x, const Tensor& y, float clip) {
  check_cpu_dtype(x, "relu");
  zip3(x, x, y, [clip](float a, float, float) { return std::min(std::max(a, 0.0f), clip); });
}

// dy passes where 0 < y < clip; without a clip wherever y > 0 (an infinite y included)
void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, float beta, float clip) {
  check_cpu_dtype(y, "relu backward");
  zip3(y, dy, dx, [beta, clip](float yv, float g, float o) {
    const float v = yv > 0.0f && (clip == kNoClip || yv < clip) ? g : 0.0f;
    return beta == 0.0f ? v : v + beta * o;
  });
}

class CpuRelu final : public ReluOp {
 public:
  explicit CpuRelu(float clip) : clip_(clip) {}
  void forward(Stream&, const Tensor& x, const Tensor& y) override { relu_forward(x, y, clip_); }
  void backward(Stream&, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta) override {
    relu_backward(y, dy, dx, beta, clip_);
  }

 private:
  float clip_;
};

}  // namespace

std::unique_ptr<ReluOp> make_relu(const TensorDesc& x, float clip) {
  if (x.dtype != DType::f32 && x.dtype != DType::bf16)
    throw UnsupportedError("relu: the cpu backend computes in fp32 or bf16");
  SB_CHECK(clip > 0.0f, "relu: the clip must be positive (kNoClip: none)");
  return std::make_unique<CpuRelu>(clip);
}

void add(const Tensor& src, const Tensor& dst, float beta) {
  check_cpu_dtype(src, "add");
  SB_CHECK(src.shape() == dst.shape(), "add: shapes differ");
  if (src.desc.layout != dst.desc.layout) {  // a layout change (the flatten of an NHWC map in NCHW order)
    SB_CHECK(src.desc.dtype == dst.desc.dtype, "add: element types differ");
    dispatch_dtype(dst.desc.dtype, [&](auto t) {
      using T = decltype(t);
      const Shape& s = dst.shape();
      for_each_nchw_row(s, [&](std::int64_t n, std::int64_t c, std::int64_t h) {
        for (std::int64_t w = 0; w < s.w; ++w) {
          const float v = ld(src.as<T>()[src.desc.offset(n, c, h, w)]);
          T& o = dst.as<T>()[dst.desc.offset(n, c, h, w)];
          o = st<T>(beta == 0.0f ? v : v + beta * ld(o));
        }
      });
    });
    return;
  }
  zip3(src, src, dst, [beta](float s, float, float o) { return beta == 0.0f ? s : s + beta * o; });
}

void scale(float* x, float alpha, std::size_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) x[i] *= alpha;
}

void fill(float* x, float v, std::size_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) x[i] = v;
}

void cast(const void* src, DType from, void* dst, DType to, std::size_t count) {
  const auto n = static_cast<std::int64_t>(count);
  // the step's weight cast and gradient widening (--precision bf16): vectorised, same rounding
  if (from == DType::f32 && to == DType::bf16) {
    const auto* a = static_cast<const float*>(src);
    auto* b = static_cast<bf16*>(dst);
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) b[i] = st<bf16>(a[i]);
    return;
  }
  if (from == DType::bf16 && to == DType::f32) {
    const auto* a = static_cast<const bf16*>(src);
    auto* b = static_cast<float*>(dst);
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) b[i] = ld(a[i]);
    return;
  }
  const std::int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; i += chunk)
    convert(static_cast<const char*>(src) + static_cast<std::size_t>(i) * dtype_size(from), from,
            static_cast<char*>(dst) + static_cast<std::size_t>(i) * dtype_size(to), to,
            static_cast<std::size_t>(std::min(chunk, n - i)));
}

}  // namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS
STEPBENCH_CPU_ISA_END
