// Which build of the hand-written kernels runs (isa.hpp), and the functions that call it.
#include "backend/cpu/isa.hpp"

#include <memory>

#include "backend/cpu/common.hpp"
#include "backend/cpu/onednn.hpp"

namespace stepbench::cpu {
namespace {

#if STEPBENCH_CPU_MULTI_ISA
bool has(dnnl::cpu_isa effective, dnnl::cpu_isa want) {  // oneDNN's ISAs are feature bit sets
  const auto e = static_cast<unsigned>(effective), w = static_cast<unsigned>(want);
  return (e & w) == w;
}
#endif

KernelIsa detect() {
#if STEPBENCH_CPU_MULTI_ISA
  // oneDNN's effective ISA checks the OS saves the vector state, and honours ONEDNN_MAX_CPU_ISA.
  const dnnl::cpu_isa onednn = dnnl::get_effective_cpu_isa();
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && has(onednn, dnnl::cpu_isa::avx512_core))
    return KernelIsa::avx512;
  if (__builtin_cpu_supports("avx2") && has(onednn, dnnl::cpu_isa::avx2)) return KernelIsa::avx2;
#endif
  return KernelIsa::base;
}

}  // namespace

KernelIsa kernel_isa() {
  static const KernelIsa isa = detect();
  return isa;
}

std::string_view kernel_builds() { return STEPBENCH_CPU_MULTI_ISA ? "x86-64 avx2 avx512" : "x86-64"; }

std::string_view to_string(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::avx512: return "avx512";
    case KernelIsa::avx2: return "avx2";
    case KernelIsa::base: break;
  }
  return "x86-64";
}

// Each function calls its namesake in the build kernel_isa() names.
#if STEPBENCH_CPU_MULTI_ISA
#define STEPBENCH_CPU_CALL(fn, ...)                                                      \
  switch (kernel_isa()) {                                                                \
    case KernelIsa::avx512: return isa_avx512::fn(__VA_ARGS__); /* NOLINT(bugprone-*) */ \
    case KernelIsa::avx2: return isa_avx2::fn(__VA_ARGS__);                              \
    case KernelIsa::base: break;                                                         \
  }                                                                                      \
  return isa_base::fn(__VA_ARGS__)
#else
#define STEPBENCH_CPU_CALL(fn, ...) return isa_base::fn(__VA_ARGS__)
#endif

std::unique_ptr<BatchNormOp> make_batch_norm(const TensorDesc& x, const BatchNormParams& p) {
  STEPBENCH_CPU_CALL(make_batch_norm, x, p);
}
std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) {
  STEPBENCH_CPU_CALL(make_pool, x, y, p);
}
std::unique_ptr<ReluOp> make_relu(const TensorDesc& x, float clip) { STEPBENCH_CPU_CALL(make_relu, x, clip); }
std::unique_ptr<AddReluOp> make_add_relu(const TensorDesc& y) { STEPBENCH_CPU_CALL(make_add_relu, y); }
void add(const Tensor& src, const Tensor& dst, float beta) { STEPBENCH_CPU_CALL(add, src, dst, beta); }
void scale(float* x, float alpha, std::size_t n) { STEPBENCH_CPU_CALL(scale, x, alpha, n); }
void fill(float* x, float v, std::size_t n) { STEPBENCH_CPU_CALL(fill, x, v, n); }
void cast(const void* src, DType from, void* dst, DType to, std::size_t count) {
  STEPBENCH_CPU_CALL(cast, src, from, dst, to, count);
}
void optimizer_update(const OptimizerConfig& cfg, float* params, const float* grads, float* s0, float* s1,
                      std::size_t n, float inv_scale) {
  STEPBENCH_CPU_CALL(optimizer_update, cfg, params, grads, s0, s1, n, inv_scale);
}
void check_finite(const float* x, std::size_t count, float* scaler) {
  STEPBENCH_CPU_CALL(check_finite, x, count, scaler);
}
void update_loss_scale(float* scaler, int growth_interval) {
  STEPBENCH_CPU_CALL(update_loss_scale, scaler, growth_interval);
}

}  // namespace stepbench::cpu
