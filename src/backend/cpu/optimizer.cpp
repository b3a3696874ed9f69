// The optimizer step (SGD, momentum, RMSProp) over the parameter arena, and dynamic loss scaling:
// the overflow check on the gradients and the scale update (LossScaler's layout: the scale,
// found_inf, good steps since the scale last changed).
#include <cmath>
#include <cstdint>

#include "backend/cpu/common.hpp"
#include "backend/cpu/isa.hpp"

STEPBENCH_CPU_ISA_BEGIN
namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS {

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

void check_finite(const float* x, std::size_t count, float* scaler) {
  bool bad = false;
#pragma omp parallel for reduction(|| : bad) schedule(static)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(count); ++i) bad = bad || !std::isfinite(x[i]);
  if (bad) scaler[1] = 1.0f;
}

void update_loss_scale(float* scaler, int growth_interval) {
  if (scaler[1] != 0.0f) {
    scaler[0] *= 0.5f;
    scaler[2] = 0.0f;
  } else if (++scaler[2] >= static_cast<float>(growth_interval)) {
    scaler[0] *= 2.0f;
    scaler[2] = 0.0f;
  }
  scaler[1] = 0.0f;
}

}  // namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS
STEPBENCH_CPU_ISA_END
