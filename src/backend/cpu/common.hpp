// What several files of the cpu backend share: the op factories backend.cpp calls (one op per
// file: batch_norm.cpp, pool.cpp, elementwise.cpp, add_relu.cpp, dropout.cpp, loss.cpp, bias_act.cpp,
// adaptive_pool.cpp; convolution and linear in onednn.hpp), the kernels more than one file calls, and the small helpers
// of the hand-written kernels (their parallel loops are in loops.hpp; isa.hpp says why).
//
// The hand-written kernels cover the ops oneDNN 2.6 runs only on reference code when a tensor is a
// strided channel slice (batch norm, pooling, elementwise), plus those it has no primitive for
// (dropout, loss, optimizers): fp32, NCHW or NHWC, any strides, OpenMP-parallel.
#pragma once
#include <fmt/format.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "backend/backend.hpp"
#include "tensor/error.hpp"

namespace stepbench::cpu {

inline std::size_t align_up(std::size_t v, std::size_t a = 64) { return (v + a - 1) / a * a; }

// ---- ops (each in the file of its name) ----------------------------------------------------------
std::unique_ptr<DropoutOp> make_dropout(const TensorDesc& x, double p);
std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const TensorDesc& logits);  // loss.cpp
std::unique_ptr<BiasActOp> make_bias_act(const TensorDesc& y, bool relu);
std::unique_ptr<AdaptiveAvgPoolOp> make_adaptive_avg_pool(const TensorDesc& x,
                                                          const TensorDesc& y);  // adaptive_pool.cpp

// ---- ops and kernels built once per instruction set (isa.hpp) ------------------------------------
// Declared in stepbench::cpu, where isa.cpp defines them to call the build kernel_isa() names, and
// in each build's namespace (isa_base, isa_avx2, isa_avx512), where their files define them.
#define STEPBENCH_CPU_PER_ISA_DECLARATIONS                                                                   \
  /* batch_norm.cpp, pool.cpp */                                                                             \
  std::unique_ptr<BatchNormOp> make_batch_norm(const TensorDesc& x, const BatchNormParams& p);               \
  std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p);          \
  /* elementwise.cpp */                                                                                      \
  std::unique_ptr<ReluOp> make_relu(const TensorDesc& x, float clip);                                        \
  /* add_relu.cpp */                                                                                         \
  std::unique_ptr<AddReluOp> make_add_relu(const TensorDesc& y);                                             \
  void add(const Tensor& src, const Tensor& dst, float beta); /* dst = src + beta * dst */                   \
  void scale(float* x, float alpha, std::size_t n);                                                          \
  void fill(float* x, float v, std::size_t n);                                                               \
  void cast(const void* src, DType from, void* dst, DType to, std::size_t count);                            \
  /* optimizer.cpp; grads * inv_scale: loss scaling */                                                       \
  void optimizer_update(const OptimizerConfig& cfg, float* params, const float* grads, float* s0, float* s1, \
                        std::size_t n, float inv_scale);                                                     \
  void check_finite(const float* x, std::size_t count, float* scaler); /* LossScaler's layout */             \
  void update_loss_scale(float* scaler, int growth_interval);

STEPBENCH_CPU_PER_ISA_DECLARATIONS
namespace isa_base {
STEPBENCH_CPU_PER_ISA_DECLARATIONS
}
namespace isa_avx2 {
STEPBENCH_CPU_PER_ISA_DECLARATIONS
}
namespace isa_avx512 {
STEPBENCH_CPU_PER_ISA_DECLARATIONS
}

// ---- loop helpers of the hand-written kernels ----------------------------------------------------
// Channel stride: a compile-time 1 for channels-last tensors, so the inner loops vectorise.
template <bool CL>
inline std::int64_t cstride(const Tensor& t) {
  return CL ? 1 : t.desc.strides.c;
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

// ---- bf16 tensors (--precision bf16): stored as the upper half of an fp32, computed in fp32 -------
// The kernels are templates over the element type T (float or bf16): ld widens a stored value,
// st<T> rounds to nearest even (tensor.hpp's float_to_bf16, NaN stays NaN), both branch-free so that
// the loops vectorise as the fp32 ones do.
struct bf16 {
  std::uint16_t bits;
};
inline float ld(float v) { return v; }
inline float ld(bf16 v) { return std::bit_cast<float>(static_cast<std::uint32_t>(v.bits) << 16); }
template <class T>
inline T st(float f);
template <>
inline float st<float>(float f) {
  return f;
}
template <>
inline bf16 st<bf16>(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x40u;  // quiet
  return bf16{static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
}
// Calls f with a value of the element type of `t` (float for fp32, bf16 for bf16 tensors).
template <class F>
void dispatch_dtype(DType t, F&& f) {
  SB_CHECK(t == DType::f32 || t == DType::bf16, "the cpu kernels take fp32 or bf16 tensors");
  if (t == DType::bf16)
    f(bf16{});
  else
    f(0.0f);
}
// Planted faults (a test-only build: cmake -DSTEPBENCH_PLANT_FAULT=<n>, tests/mutation/plant_faults.sh;
// 1-4 in conv.cpp). 7: the variance of batch norm's statistics-only forward (y without data) leaves
// out the last pixel (batch_norm.cpp).
#ifndef STEPBENCH_PLANT_FAULT
#define STEPBENCH_PLANT_FAULT 0
#endif
inline bool planted_skip(const Tensor& y, const Shape& s, std::int64_t n, std::int64_t h, std::int64_t w) {
  return STEPBENCH_PLANT_FAULT == 7 && !y.data && n == s.n - 1 && h == s.h - 1 && w == s.w - 1;
}
inline void check_cpu_dtype(const Tensor& t, const char* what) {
  SB_CHECK(t.desc.dtype == DType::f32 || t.desc.dtype == DType::bf16,
           fmt::format("{}: the cpu kernels take fp32 or bf16 tensors", what));
}

}  // namespace stepbench::cpu
