// The optimizer update over the whole parameter arena in one launch: SGD, SGD with momentum
// (PyTorch's) or RMSProp (TensorFlow's), skipped when the loss scaler saw an overflow this step.
#include "backend/cuda/kernels_common.cuh"

namespace stepbench::cuda {
namespace {

__global__ void opt_k(OptArgs a, float* p, const float* g, float* s0, float* s1, long long n, const float* scaler) {
  if (scaler && scaler[1] != 0.0f) return;  // an overflow this step: skip the update
  const float inv_scale = scaler ? 1.0f / scaler[0] : 1.0f;
  GRID_STRIDE(i, n) {
    const float gi = g[i] * inv_scale + a.wd * p[i];
    if (a.kind == 0) {
      p[i] -= a.lr * gi;
    } else if (a.kind == 1) {  // PyTorch's SGD(momentum)
      s0[i] = a.mu * s0[i] + gi;
      p[i] -= a.lr * s0[i];
    } else {  // TensorFlow's RMSProp
      s0[i] = a.rho * s0[i] + (1.0f - a.rho) * gi * gi;
      s1[i] = a.mu * s1[i] + a.lr * gi / sqrtf(s0[i] + a.eps);
      p[i] -= s1[i];
    }
  }
}

}  // namespace

cudaError_t launch_optimizer_update(OptArgs a, float* params, const float* grads, float* s0, float* s1, std::size_t n,
                                    const float* scaler, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  opt_k<<<grid_for(static_cast<long long>(n)), kThreads, 0, s>>>(a, params, grads, s0, s1, static_cast<long long>(n),
                                                                 scaler);
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
