// What several files of the cpu backend share: the op factories backend.cpp calls (one op per
// file: batch_norm.cpp, pool.cpp, elementwise.cpp, dropout.cpp, loss.cpp; convolution and linear in
// onednn.hpp), the kernels more than one file calls, and the loop helpers of the hand-written
// kernels.
//
// The hand-written kernels cover the ops oneDNN 2.6 runs only on reference code when a tensor is a
// strided channel slice (batch norm, pooling, elementwise), plus those it has no primitive for
// (dropout, loss, optimizers): fp32, NCHW or NHWC, any strides, OpenMP-parallel.
#pragma once
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "backend/backend.hpp"
#include "tensor/error.hpp"

namespace stepbench::cpu {

inline std::size_t align_up(std::size_t v, std::size_t a = 64) { return (v + a - 1) / a * a; }

// ---- ops (each in the file of its name) ----------------------------------------------------------
std::unique_ptr<BatchNormOp> make_batch_norm(const TensorDesc& x, const BatchNormParams& p);
std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p);
std::unique_ptr<ReluOp> make_relu(const TensorDesc& x);  // elementwise.cpp
std::unique_ptr<DropoutOp> make_dropout(const TensorDesc& x, double p);
std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const TensorDesc& logits);  // loss.cpp

// ---- kernels used by more than one file ----------------------------------------------------------
// elementwise.cpp
void add(const Tensor& src, const Tensor& dst, float beta);  // dst = src + beta * dst
void scale(float* x, float alpha, std::size_t n);
void fill(float* x, float v, std::size_t n);
void cast(const void* src, DType from, void* dst, DType to, std::size_t count);
// optimizer.cpp
void optimizer_update(const OptimizerConfig& cfg, float* params, const float* grads, float* s0, float* s1,
                      std::size_t n, float inv_scale = 1.0f);         // grads * inv_scale: loss scaling
void check_finite(const float* x, std::size_t count, float* scaler);  // LossScaler's layout
void update_loss_scale(float* scaler, int growth_interval);

// ---- loop helpers of the hand-written kernels ----------------------------------------------------
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

// Calls row(n, c, h) for every row of an NCHW shape, in parallel: each row's s.w values are
// contiguous, also in a channel slice, so the inner loops stream and vectorise along w.
template <class F>
void for_each_nchw_row(const Shape& s, F&& row) {
#pragma omp parallel for collapse(3) schedule(static)
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t h = 0; h < s.h; ++h) row(n, c, h);
}

template <class F>
void dispatch_layout(const Tensor& t, F&& f) {
  if (t.desc.layout == Layout::nhwc)
    f(std::true_type{});
  else
    f(std::false_type{});
}

inline void check_f32(const Tensor& t, const char* what) {
  SB_CHECK(t.desc.dtype == DType::f32, fmt::format("{}: the cpu kernels take fp32 tensors", what));
}

}  // namespace stepbench::cpu
