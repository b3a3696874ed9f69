// Dropout: a counter-based mask (splitmix64 of a key made from the seed and the step, plus the
// element index), the same as the CPU backend's, kept in the reserve for the backward.
#include "backend/cuda/kernels_common.cuh"

namespace stepbench::cuda {
namespace {

__device__ __forceinline__ std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
std::uint64_t splitmix64_host(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The same mask as the CPU backend: keep when the element's 24-bit uniform is >= p.
__global__ void dropout_fwd_k(Flat x, Flat y, std::uint8_t* mask, long long n, std::uint32_t threshold,
                              float keep_scale, std::uint64_t key) {
  GRID_STRIDE(i, n) {
    const auto u = static_cast<std::uint32_t>(splitmix64(key + static_cast<std::uint64_t>(i)) >> 40);
    const std::uint8_t keep = u >= threshold;
    mask[i] = keep;
    st(y, i, keep ? ld(x, i) * keep_scale : 0.0f);
  }
}
__global__ void dropout_bwd_k(Flat dy, Flat dx, const std::uint8_t* mask, long long n, float keep_scale, float beta) {
  GRID_STRIDE(i, n) {
    const float v = mask[i] ? ld(dy, i) * keep_scale : 0.0f;
    st(dx, i, beta == 0.0f ? v : v + beta * ld(dx, i));
  }
}

}  // namespace

cudaError_t launch_dropout_forward(Flat x, Flat y, std::uint8_t* mask, long long n, double p, std::uint64_t seed,
                                   std::uint64_t step, cudaStream_t s) {
  const std::uint64_t key = splitmix64_host(seed ^ splitmix64_host(step));
  const auto threshold = static_cast<std::uint32_t>(p * 16777216.0);
  dropout_fwd_k<<<grid_for(n), kThreads, 0, s>>>(x, y, mask, n, threshold, static_cast<float>(1.0 / (1.0 - p)), key);
  return cudaGetLastError();
}
cudaError_t launch_dropout_backward(Flat dy, Flat dx, const std::uint8_t* mask, long long n, double p, float beta,
                                    cudaStream_t s) {
  dropout_bwd_k<<<grid_for(n), kThreads, 0, s>>>(dy, dx, mask, n, static_cast<float>(1.0 / (1.0 - p)), beta);
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
