// Small CUDA kernels of stepbench's own. The full set (loss, dropout, optimizers over the arena)
// belongs to the CUDA-backend work; this one fills a buffer and keeps nvcc in every CI build.
#include <cuda_runtime.h>

#include <cstddef>

namespace stepbench::cuda {

__global__ void fill_kernel(float* x, float v, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x)
    x[i] = v;
}

cudaError_t launch_fill(float* x, float v, std::size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
  fill_kernel<<<blocks, 256, 0, s>>>(x, v, n);
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
