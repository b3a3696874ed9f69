// Softmax cross-entropy: per-sample probabilities and losses, their mean, and the gradient. Labels
// outside [0, M) are flagged in device memory for the host to report.
#include "backend/cuda/kernels_common.cuh"

namespace stepbench::cuda {
namespace {

// One block per sample.
__global__ void xent_rows_k(Flat z, const std::int32_t* labels, float* probs, float* row_loss, int* bad, long long M) {
  const long long r = blockIdx.x;
  auto zr = [&](long long j) { return ld(z, r * M + j); };
  float* pr = probs + r * M;
  __shared__ float red[kThreads];
  float mx = -INFINITY;
  for (long long j = threadIdx.x; j < M; j += blockDim.x) mx = fmaxf(mx, zr(j));
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  mx = red[0];
  __syncthreads();
  double sum = 0;
  for (long long j = threadIdx.x; j < M; j += blockDim.x) {
    const float e = expf(zr(j) - mx);
    pr[j] = e;
    sum += e;
  }
  sum = block_sum(sum);
  const float inv = static_cast<float>(1.0 / sum);
  for (long long j = threadIdx.x; j < M; j += blockDim.x) pr[j] *= inv;
  if (threadIdx.x == 0) {
    const std::int32_t l = labels[r];
    if (l < 0 || l >= M) {
      atomicCAS(bad, 0, static_cast<int>(r) + 1);
      row_loss[r] = 0;
    } else {
      row_loss[r] = static_cast<float>(log(sum) + mx - zr(l));
    }
  }
}
__global__ void mean_k(const float* v, float* out, long long n) {
  double s = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = static_cast<float>(s / static_cast<double>(n));
}
__global__ void xent_bwd_k(const std::int32_t* labels, Flat d, const float* probs, float k, float beta,
                           const float* loss_scale, long long N, long long M) {
  const float kk = loss_scale ? k * *loss_scale : k;
  GRID_STRIDE(i, N * M) {
    const long long r = i / M, j = i % M;
    const float v = kk * (probs[i] - (j == labels[r] ? 1.0f : 0.0f));
    st(d, i, beta == 0.0f ? v : v + beta * ld(d, i));
  }
}

}  // namespace

cudaError_t launch_softmax_xent_forward(Flat logits, const std::int32_t* labels, float* loss, float* probs,
                                        float* row_loss, int* bad_label, long long N, long long M, cudaStream_t s) {
  xent_rows_k<<<static_cast<unsigned>(N), kThreads, 0, s>>>(logits, labels, probs, row_loss, bad_label, M);
  mean_k<<<1, kThreads, 0, s>>>(row_loss, loss, N);
  return cudaGetLastError();
}
cudaError_t launch_softmax_xent_backward(const std::int32_t* labels, Flat dlogits, const float* probs, float scale,
                                         float beta, const float* loss_scale, long long N, long long M,
                                         cudaStream_t s) {
  xent_bwd_k<<<grid_for(N * M), kThreads, 0, s>>>(labels, dlogits, probs, scale / static_cast<float>(N), beta,
                                                  loss_scale, N, M);
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
