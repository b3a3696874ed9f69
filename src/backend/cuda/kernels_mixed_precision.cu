// Mixed precision: casts between storage types, and dynamic loss scaling (the overflow check of
// the gradients and the scale update). The scaler is three floats in device memory: the scale,
// the overflow flag of this step, and the steps since the last change.
#include "backend/cuda/kernels_common.cuh"

namespace stepbench::cuda {
namespace {

__global__ void cast_k(Flat src, Flat dst, long long n) { GRID_STRIDE(i, n) st(dst, i, ld(src, i)); }
__global__ void check_finite_k(const float* x, long long n, float* scaler) {
  bool bad = false;
  GRID_STRIDE(i, n) bad |= !isfinite(x[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) scaler[1] = 1.0f;  // only ever set: no race that matters
}
__global__ void update_scale_k(float* scaler, int growth_interval) {
  if (scaler[1] != 0.0f) {
    scaler[0] *= 0.5f;
    scaler[2] = 0.0f;
  } else if ((scaler[2] += 1.0f) >= static_cast<float>(growth_interval)) {
    scaler[0] *= 2.0f;
    scaler[2] = 0.0f;
  }
  scaler[1] = 0.0f;
}

}  // namespace

cudaError_t launch_cast(Flat src, Flat dst, std::size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  cast_k<<<grid_for(static_cast<long long>(n)), kThreads, 0, s>>>(src, dst, static_cast<long long>(n));
  return cudaGetLastError();
}
cudaError_t launch_check_finite(const float* x, std::size_t n, float* scaler, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  check_finite_k<<<grid_for(static_cast<long long>(n)), kThreads, 0, s>>>(x, static_cast<long long>(n), scaler);
  return cudaGetLastError();
}
cudaError_t launch_update_loss_scale(float* scaler, int growth_interval, cudaStream_t s) {
  update_scale_k<<<1, 1, 0, s>>>(scaler, growth_interval);
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
