// The fully connected layer's bias: added to the GEMM output, and its gradient (column sums).
#include "backend/cuda/kernels_common.cuh"

namespace stepbench::cuda {
namespace {

__global__ void add_bias_k(Flat y, Flat b, long long N, long long M) {
  GRID_STRIDE(i, N * M) st(y, i, ld(y, i) + ld(b, i % M));
}
__global__ void bias_grad_k(Flat dy, Flat db, long long N, long long M) {
  GRID_STRIDE(m, M) {
    double s = 0;
    for (long long r = 0; r < N; ++r) s += ld(dy, r * M + m);
    st(db, m, static_cast<float>(s));
  }
}

}  // namespace

cudaError_t launch_add_bias(Flat y, Flat b, long long N, long long M, cudaStream_t s) {
  add_bias_k<<<grid_for(N * M), kThreads, 0, s>>>(y, b, N, M);
  return cudaGetLastError();
}
cudaError_t launch_bias_grad(Flat dy, Flat db, long long N, long long M, cudaStream_t s) {
  bias_grad_k<<<grid_for(M), kThreads, 0, s>>>(dy, db, N, M);
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
