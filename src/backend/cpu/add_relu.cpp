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
inline float* at(const Tensor& t, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return t.as<float>() + t.desc.offset(n, c, h, w);
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
  check_f32(y, "add_relu");
  SB_CHECK(a.shape() == y.shape() && b.shape() == y.shape(), "add_relu: shapes differ");
  for_each_run(y.shape(), y.desc.layout,
               [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t len) {
                 const float* pa = at(a, n, c, h, w);
                 const float* pb = at(b, n, c, h, w);
                 float* py = at(y, n, c, h, w);
                 for (std::int64_t i = 0; i < len; ++i) py[i] = std::max(pa[i] + pb[i], 0.0f);
               });
}

// d = g + beta * d (beta 0: d is not read, as every gradient output's overwrite)
inline float accumulate(float g, float beta, float d) { return beta == 0.0f ? g : g + beta * d; }

void add_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& da, float beta_a, const Tensor& db,
                       float beta_b) {
  check_f32(y, "add_relu backward");
  const bool to_a = da.data != nullptr, to_b = db.data != nullptr;
  SB_CHECK((!to_a || da.shape() == y.shape()) && (!to_b || db.shape() == y.shape()) && dy.shape() == y.shape(),
           "add_relu backward: shapes differ");
  for_each_run(y.shape(), y.desc.layout,
               [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t len) {
                 const float* py = at(y, n, c, h, w);
                 const float* pg = at(dy, n, c, h, w);
                 float* pa = to_a ? at(da, n, c, h, w) : nullptr;
                 float* pb = to_b ? at(db, n, c, h, w) : nullptr;
                 if (to_a && to_b) {
                   for (std::int64_t i = 0; i < len; ++i) {
                     const float g = py[i] > 0.0f ? pg[i] : 0.0f;
                     pa[i] = accumulate(g, beta_a, pa[i]);
                     pb[i] = accumulate(g, beta_b, pb[i]);
                   }
                 } else if (to_a || to_b) {
                   float* pd = to_a ? pa : pb;
                   const float beta = to_a ? beta_a : beta_b;
                   for (std::int64_t i = 0; i < len; ++i) pd[i] = accumulate(py[i] > 0.0f ? pg[i] : 0.0f, beta, pd[i]);
                 }
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
  if (y.dtype != DType::f32) throw UnsupportedError("add_relu: the cpu backend computes in fp32 only");
  return std::make_unique<CpuAddRelu>();
}

}  // namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS
STEPBENCH_CPU_ISA_END
