// The residual connection's add + ReLU (AddReluOp), fused, on hand-written kernels: one pass
// forward (y = max(a + b, 0)) and one backward (the masked gradient written to both inputs).
// Per pixel along the contiguous channels in NHWC, per row along w in NCHW; any strides.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "backend/cpu/common.hpp"
#include "backend/cpu/isa.hpp"

STEPBENCH_CPU_ISA_BEGIN
#include "backend/cpu/loops.hpp"  // after BEGIN: its loops are built for this file's set

namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS {
namespace {

// The start of (n, c, h, w)'s contiguous run in t: a row of w in NCHW, a pixel's channels in NHWC.
template <class T>
inline T* at(const Tensor& t, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return t.as<T>() + t.desc.offset(n, c, h, w);
}

// body(n, c, h, w, len) for every contiguous run of len elements starting at (n, c, h, w).
template <class F>
void for_each_run(const Shape& s, Layout l, F&& body) {
  if (l == Layout::nchw)
    for_each_nchw_row(s, [&](std::int64_t n, std::int64_t c, std::int64_t h) { body(n, c, h, std::int64_t{0}, s.w); });
  else
    for_each_pixel(s, [&](std::int64_t n, std::int64_t h, std::int64_t w) { body(n, std::int64_t{0}, h, w, s.c); });
}

void add_relu_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  check_cpu_dtype(y, "add_relu");
  SB_CHECK(a.shape() == y.shape() && b.shape() == y.shape(), "add_relu: shapes differ");
  SB_CHECK(a.desc.dtype == y.desc.dtype && b.desc.dtype == y.desc.dtype, "add_relu: element types differ");
  dispatch_dtype(y.desc.dtype, [&](auto t) {
    using T = decltype(t);
    for_each_run(y.shape(), y.desc.layout,
                 [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t len) {
                   const T* pa = at<T>(a, n, c, h, w);
                   const T* pb = at<T>(b, n, c, h, w);
                   T* py = at<T>(y, n, c, h, w);
                   for (std::int64_t i = 0; i < len; ++i) py[i] = st<T>(std::max(ld(pa[i]) + ld(pb[i]), 0.0f));
                 });
  });
}

// d = g + beta * d (beta 0: d is not read, as every gradient output's overwrite)
inline float accumulate(float g, float beta, float d) { return beta == 0.0f ? g : g + beta * d; }

void add_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& da, float beta_a, const Tensor& db,
                       float beta_b) {
  check_cpu_dtype(y, "add_relu backward");
  const bool to_a = da.data != nullptr, to_b = db.data != nullptr;
  SB_CHECK((!to_a || da.shape() == y.shape()) && (!to_b || db.shape() == y.shape()) && dy.shape() == y.shape(),
           "add_relu backward: shapes differ");
  dispatch_dtype(y.desc.dtype, [&](auto t) {
    using T = decltype(t);
    for_each_run(
        y.shape(), y.desc.layout,
        [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t len) {
          const T* py = at<T>(y, n, c, h, w);
          const T* pg = at<T>(dy, n, c, h, w);
          T* pa = to_a ? at<T>(da, n, c, h, w) : nullptr;
          T* pb = to_b ? at<T>(db, n, c, h, w) : nullptr;
          if (to_a && to_b) {
            for (std::int64_t i = 0; i < len; ++i) {
              const float g = ld(py[i]) > 0.0f ? ld(pg[i]) : 0.0f;
              pa[i] = st<T>(accumulate(g, beta_a, beta_a == 0.0f ? 0.0f : ld(pa[i])));
              pb[i] = st<T>(accumulate(g, beta_b, beta_b == 0.0f ? 0.0f : ld(pb[i])));
            }
          } else if (to_a || to_b) {
            T* pd = to_a ? pa : pb;
            const float beta = to_a ? beta_a : beta_b;
            for (std::int64_t i = 0; i < len; ++i)
              pd[i] = st<T>(accumulate(ld(py[i]) > 0.0f ? ld(pg[i]) : 0.0f, beta, beta == 0.0f ? 0.0f : ld(pd[i])));
          }
        });
  });
}

class CpuAddRelu final : public AddReluOp {
 public:
  void forward(Stream&, const Tensor& a, const Tensor& b, const Tensor& y) override { add_relu_forward(a, b, y); }
  void backward(Stream&, const Tensor& y, const Tensor& dy, const Tensor& da, float beta_a, const Tensor& db,
                float beta_b) override {
    add_relu_backward(y, dy, da, beta_a, db, beta_b);
  }
};

}  // namespace

std::unique_ptr<AddReluOp> make_add_relu(const TensorDesc& y) {
  if (y.dtype != DType::f32 && y.dtype != DType::bf16)
    throw UnsupportedError("add_relu: the cpu backend computes in fp32 or bf16");
  return std::make_unique<CpuAddRelu>();
}

}  // namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS
STEPBENCH_CPU_ISA_END
