// Batch norm kernels over (N, H, W) per channel: training forward and backward with one block per
// channel and two-pass statistics in double, and the inference pass (the row kernels where the
// views allow, kernels_rows.cu). The formulas mirror src/backend/cpu/cpu_kernels.cpp.
#include "backend/cuda/kernels_rows.cuh"

namespace stepbench::cuda {
namespace {

// One block per channel; element k of the channel is (n, h, w) with k = (n * H + h) * W + w.
__device__ __forceinline__ long long chan_off(const View& v, long long c, long long k) {
  const long long w = k % v.w;
  const long long t = k / v.w;
  return off4(v, t / v.h, c, t % v.h, w);
}

__global__ void bn_train_k(View x, View y, const float* gamma, const float* beta, float* rmean, float* rvar,
                           float* smean, float* sinvstd, double eps, double momentum, bool relu) {
  const long long c = blockIdx.x, M = x.n * x.h * x.w;
  double s = 0;
  for (long long k = threadIdx.x; k < M; k += blockDim.x) s += ld(x, chan_off(x, c, k));
  const double mean = block_sum(s) / static_cast<double>(M);
  double q = 0;
  for (long long k = threadIdx.x; k < M; k += blockDim.x) {
    const double d = ld(x, chan_off(x, c, k)) - mean;
    q += d * d;
  }
  const double var = block_sum(q) / static_cast<double>(M);
  const double invstd = 1.0 / sqrt(var + eps);
  if (threadIdx.x == 0) {
    smean[c] = static_cast<float>(mean);
    sinvstd[c] = static_cast<float>(invstd);
    const double unbiased = M > 1 ? var * M / (M - 1) : var;
    rmean[c] = static_cast<float>((1 - momentum) * rmean[c] + momentum * mean);
    rvar[c] = static_cast<float>((1 - momentum) * rvar[c] + momentum * unbiased);
  }
  const float a = static_cast<float>(gamma[c] * invstd), b = static_cast<float>(beta[c] - mean * gamma[c] * invstd);
  for (long long k = threadIdx.x; k < M; k += blockDim.x) {
    const float v = a * ld(x, chan_off(x, c, k)) + b;
    st(y, chan_off(y, c, k), relu ? fmaxf(v, 0.0f) : v);
  }
}

__global__ void bn_infer_k(View x, View y, const float* gamma, const float* beta, const float* rmean, const float* rvar,
                           double eps, bool relu, long long n) {
  GRID_STRIDE(i, n) {
    const long long c = (i / (x.h * x.w)) % x.c;
    const double invstd = 1.0 / sqrt(static_cast<double>(rvar[c]) + eps);
    const float a = static_cast<float>(gamma[c] * invstd),
                b = static_cast<float>(beta[c] - rmean[c] * gamma[c] * invstd);
    const float v = a * ld(x, offset_of(x, i)) + b;
    st(y, offset_of(y, i), relu ? fmaxf(v, 0.0f) : v);
  }
}

__global__ void bn_bwd_k(View x, View y, View dy, View dx, const float* gamma, const float* smean, const float* sinvstd,
                         float* dgamma, float* dbeta, float beta_dx, bool relu) {
  const long long c = blockIdx.x, M = x.n * x.h * x.w;
  const float mean = smean[c], invstd = sinvstd[c];
  double sg = 0, sgx = 0;
  for (long long k = threadIdx.x; k < M; k += blockDim.x) {
    const float g = (!relu || ld(y, chan_off(y, c, k)) > 0.0f) ? ld(dy, chan_off(dy, c, k)) : 0.0f;
    sg += g;
    sgx += static_cast<double>(g) * (ld(x, chan_off(x, c, k)) - mean) * invstd;
  }
  const double tg = block_sum(sg), tgx = block_sum(sgx);
  if (threadIdx.x == 0) {
    dgamma[c] = static_cast<float>(tgx);
    dbeta[c] = static_cast<float>(tg);
  }
  const float k1 = gamma[c] * invstd, k2 = static_cast<float>(tg / M), k3 = static_cast<float>(tgx / M) * invstd;
  for (long long k = threadIdx.x; k < M; k += blockDim.x) {
    const float g = (!relu || ld(y, chan_off(y, c, k)) > 0.0f) ? ld(dy, chan_off(dy, c, k)) : 0.0f;
    const float v = k1 * (g - k2 - (ld(x, chan_off(x, c, k)) - mean) * k3);
    const long long o = chan_off(dx, c, k);
    st(dx, o, beta_dx == 0.0f ? v : v + beta_dx * ld(dx, o));
  }
}

}  // namespace

cudaError_t launch_bn_forward_training(View x, View y, const float* gamma, const float* beta, float* running_mean,
                                       float* running_var, float* save_mean, float* save_invstd, double eps,
                                       double momentum, bool relu, cudaStream_t s) {
  bn_train_k<<<static_cast<unsigned>(x.c), kThreads, 0, s>>>(x, y, gamma, beta, running_mean, running_var, save_mean,
                                                             save_invstd, eps, momentum, relu);
  return cudaGetLastError();
}
cudaError_t launch_bn_forward_inference(View x, View y, const float* gamma, const float* beta, const float* rmean,
                                        const float* rvar, double eps, bool relu, cudaStream_t s) {
  RowArgs a{};
  a.gamma = gamma;
  a.bnbeta = beta;
  a.mean = rmean;
  a.var = rvar;
  a.eps = static_cast<float>(eps);
  a.relu = relu;
  const View v[2] = {x, y};
  cudaError_t err = cudaSuccess;
  if (launch_rows<kBnInfer>(a, v, 2, s, err)) return err;
  bn_infer_k<<<grid_for(numel(x)), kThreads, 0, s>>>(x, y, gamma, beta, rmean, rvar, eps, relu, numel(x));
  return cudaGetLastError();
}
cudaError_t launch_bn_backward(View x, View y, View dy, View dx, const float* gamma, const float* save_mean,
                               const float* save_invstd, float* dgamma, float* dbeta, float beta_dx, bool relu,
                               cudaStream_t s) {
  bn_bwd_k<<<static_cast<unsigned>(x.c), kThreads, 0, s>>>(x, y, dy, dx, gamma, save_mean, save_invstd, dgamma, dbeta,
                                                           beta_dx, relu);
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
