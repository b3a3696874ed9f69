// Batch norm kernels over (N, H, W) per channel (kernels.hpp): the training forward and backward as
// multi-block reductions over rows (kernels_rows.cuh) with a fixed summation order, one block per
// channel for any other view, and the inference pass. The formulas mirror src/backend/cpu/cpu_kernels.cpp.
#include <algorithm>

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
  const float a = static_cast<float>(gamma[c] * invstd), m = static_cast<float>(mean);
  for (long long k = threadIdx.x; k < M; k += blockDim.x) {
    const float v = a * (ld(x, chan_off(x, c, k)) - m) + beta[c];
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

// The recompute's factors from the saved statistics, laid out as bn_finalize_k's forward ones (a, beta,
// mean); a from the saved float invstd where the forward used the double one, so within a rounding of it.
__global__ void bn_saved_coef_k(const float* gamma, const float* beta, const float* smean, const float* sinvstd,
                                long long C, float4* coef) {
  const long long c = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (c < C)
    coef[c] = make_float4(static_cast<float>(static_cast<double>(gamma[c]) * sinvstd[c]), beta[c], smean[c], 0.0f);
}

__global__ void bn_recompute_k(View x, View y, const float4* coef, bool relu, long long n) {
  GRID_STRIDE(i, n) {
    const float4 f = coef[(i / (x.h * x.w)) % x.c];
    const float v = f.x * (ld(x, offset_of(x, i)) - f.z) + f.y;
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

// ---- the row path: partial sums per chunk of rows, a per-channel total, one apply pass ----------------
// Channels-last rows (N*H*W rows of C): blocks of 32 channels x 8 rows, a chunk of rows per block,
// threads along channels (coalesced). NCHW rows (N*C planes of H*W): a block per channel and chunk of
// images, threads along the plane. Each block writes one partial (double2) per channel, which
// bn_finalize sums over the chunks in order: the result does not depend on scheduling.
constexpr int kTileC = 32, kTileR = 8;
constexpr long long kTargetBlocks = 1024;  // a few waves on the largest GPUs

struct BnGrid {
  long long units;      // cl: rows; NCHW: images
  long long per_chunk;  // rows (cl) or images per block
  long long chunks;
};
BnGrid bn_grid(long long n, long long c, long long h, long long w, bool cl) {
  BnGrid g{};
  long long want = 1;
  if (cl) {
    g.units = n * h * w;
    const long long tiles = (c + kTileC - 1) / kTileC;
    want = std::min((kTargetBlocks + tiles - 1) / tiles, std::max(g.units / (8 * kTileR), 1LL));
  } else {
    g.units = n;
    want = std::min((kTargetBlocks + c - 1) / c, n);
  }
  want = std::max(want, 1LL);
  g.per_chunk = (g.units + want - 1) / want;
  g.chunks = (g.units + g.per_chunk - 1) / g.per_chunk;
  return g;
}
// [partials: chunks x C double2 | coefficients: C float4]
double2* bn_partials(void* scratch) { return static_cast<double2*>(scratch); }
float4* bn_coef(void* scratch, const BnGrid& g, long long c) {
  return reinterpret_cast<float4*>(static_cast<double2*>(scratch) + g.chunks * c);
}

template <class T>
__device__ __forceinline__ float ldr(const Rows& r, long long q, long long rem, long long j) {
  return to_f(reinterpret_cast<const T*>(r.p)[q * r.so + rem * r.si + j]);
}

// BWD false: sums of x - K and its square, K = the channel's first element (a shift that keeps the
// variance's cancellation small). BWD true: sums of g and g (x - mean), g = dy masked by y > 0.
template <class T, bool BWD>
__global__ void bn_stats_cl_k(Rows x, Rows y, Rows dy, long long C, BnGrid g, const float* mean, bool relu,
                              double2* part) {
  const long long c = blockIdx.x * static_cast<long long>(kTileC) + threadIdx.x;
  const long long r0 = blockIdx.y * g.per_chunk + threadIdx.y, r1 = min(g.units, (blockIdx.y + 1) * g.per_chunk);
  double s1 = 0, s2 = 0;
  if (c < C && r0 < r1) {
    const float k = BWD ? mean[c] : ldr<T>(x, 0, 0, c);
    long long q = r0 / x.r1, rem = r0 % x.r1;  // the row as (image, row in image), stepped without division
    for (long long r = r0; r < r1; r += kTileR) {
      const float xv = ldr<T>(x, q, rem, c) - k;
      if (BWD) {
        const float gv = (!relu || ldr<T>(y, q, rem, c) > 0.0f) ? ldr<T>(dy, q, rem, c) : 0.0f;
        s1 += gv;
        s2 += static_cast<double>(gv) * xv;
      } else {
        s1 += xv;
        s2 += static_cast<double>(xv) * xv;
      }
      rem += kTileR;
      while (rem >= x.r1) {
        rem -= x.r1;
        ++q;
      }
    }
  }
  __shared__ double2 sh[kTileR][kTileC];
  sh[threadIdx.y][threadIdx.x] = make_double2(s1, s2);
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double2 t = sh[0][threadIdx.x];
    for (int k = 1; k < kTileR; ++k) {
      t.x += sh[k][threadIdx.x].x;
      t.y += sh[k][threadIdx.x].y;
    }
    part[blockIdx.y * C + c] = t;
  }
}

template <class T, bool BWD>
__global__ void bn_stats_plane_k(Rows x, Rows y, Rows dy, long long C, BnGrid g, const float* mean, bool relu,
                                 double2* part) {
  const long long c = blockIdx.x, n0 = blockIdx.y * g.per_chunk, n1 = min(g.units, n0 + g.per_chunk);
  const float k = BWD ? mean[c] : ldr<T>(x, 0, c, 0);
  double s1 = 0, s2 = 0;
  for (long long n = n0; n < n1; ++n)
    for (long long j = threadIdx.x; j < x.len; j += blockDim.x) {
      const float xv = ldr<T>(x, n, c, j) - k;
      if (BWD) {
        const float gv = (!relu || ldr<T>(y, n, c, j) > 0.0f) ? ldr<T>(dy, n, c, j) : 0.0f;
        s1 += gv;
        s2 += static_cast<double>(gv) * xv;
      } else {
        s1 += xv;
        s2 += static_cast<double>(xv) * xv;
      }
    }
  const double t1 = block_sum(s1), t2 = block_sum(s2);
  if (threadIdx.x == 0) part[blockIdx.y * C + c] = make_double2(t1, t2);
}

// Per channel: the partials summed in chunk order, the saved and running statistics (forward) or
// the parameter gradients (backward), and the coefficients of the apply pass.
template <class T, bool BWD>
__global__ void bn_finalize_k(Rows x, bool cl, long long C, BnGrid g, long long M, const double2* part,
                              const float* gamma, const float* beta, float* rmean, float* rvar, float* smean,
                              float* sinvstd, double eps, double momentum, float* dgamma, float* dbeta, float4* coef) {
  const long long c = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  double t1 = 0, t2 = 0;
  for (long long k = 0; k < g.chunks; ++k) {
    t1 += part[k * C + c].x;
    t2 += part[k * C + c].y;
  }
  if (!BWD) {
    const double shift = cl ? ldr<T>(x, 0, 0, c) : ldr<T>(x, 0, c, 0);
    const double dm = t1 / static_cast<double>(M);
    const double var = fmax(t2 / static_cast<double>(M) - dm * dm, 0.0), mean = shift + dm;
    const double invstd = 1.0 / sqrt(var + eps);
    smean[c] = static_cast<float>(mean);
    sinvstd[c] = static_cast<float>(invstd);
    const double unbiased = M > 1 ? var * M / (M - 1) : var;
    rmean[c] = static_cast<float>((1 - momentum) * rmean[c] + momentum * mean);
    rvar[c] = static_cast<float>((1 - momentum) * rvar[c] + momentum * unbiased);
    // y = gamma invstd (x - mean) + beta: the mean subtracted first (as a * x + b, a channel whose
    // values sit far from zero relative to their spread loses |mean| / std ulps in the difference)
    coef[c] = make_float4(static_cast<float>(gamma[c] * invstd), beta[c], static_cast<float>(mean), 0.0f);
  } else {
    const float invstd = sinvstd[c];
    const double tgx = t2 * invstd;  // sum of g * xhat
    dgamma[c] = static_cast<float>(tgx);
    dbeta[c] = static_cast<float>(t1);
    coef[c] =
        make_float4(gamma[c] * invstd, static_cast<float>(t1 / M), static_cast<float>(tgx / M) * invstd, smean[c]);
  }
}

// The row path of training forward (views {x, y}) or backward ({x, y, dy, dx}); false when the views
// are not rows of one order (nothing launched).
template <bool BWD>
bool bn_rows(const View* v, int nv, const float* gamma, const float* beta, float* rmean, float* rvar, float* smean,
             float* sinvstd, double eps, double momentum, float* dgamma, float* dbeta, float beta_dx, bool relu,
             void* scratch, cudaStream_t s, cudaError_t& err) {
  const View& dst = v[nv - 1];
  const bool cl = dst.sc == 1 && dst.c > 1;  // launch_rows's rule, so that its apply pass agrees
  Rows r[4] = {};
  if (!scratch || numel(v[0]) >= (1LL << 31) || !all_rows(v, nv, cl, r)) return false;
  const Rows& y = BWD ? r[1] : r[0];
  const Rows& dy = BWD ? r[2] : r[0];
  const long long C = v[0].c, M = v[0].n * v[0].h * v[0].w;
  const BnGrid g = bn_grid(v[0].n, C, v[0].h, v[0].w, cl);
  double2* part = bn_partials(scratch);
  float4* coef = bn_coef(scratch, g, C);
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    if (cl)
      bn_stats_cl_k<T, BWD><<<dim3(static_cast<unsigned>((C + kTileC - 1) / kTileC), static_cast<unsigned>(g.chunks)),
                              dim3(kTileC, kTileR), 0, s>>>(r[0], y, dy, C, g, smean, relu, part);
    else
      bn_stats_plane_k<T, BWD><<<dim3(static_cast<unsigned>(C), static_cast<unsigned>(g.chunks)), kThreads, 0, s>>>(
          r[0], y, dy, C, g, smean, relu, part);
    bn_finalize_k<T, BWD><<<static_cast<unsigned>((C + kThreads - 1) / kThreads), kThreads, 0, s>>>(
        r[0], cl, C, g, M, part, gamma, beta, rmean, rvar, smean, sinvstd, eps, momentum, dgamma, dbeta, coef);
  };
  if (v[0].t == kF32)
    run(float{});
  else if (v[0].t == kBF16)
    run(__nv_bfloat16{});
  else
    run(__half{});
  err = cudaGetLastError();
  if (err != cudaSuccess) return true;
  RowArgs a{};
  a.coef = coef;
  a.relu = relu;
  a.beta = beta_dx;
  if (!launch_rows < BWD ? kBnBwdApply : kBnApply > (a, v, nv, s, err)) err = cudaErrorInvalidValue;  // cannot happen
  return true;
}

}  // namespace

std::size_t bn_scratch_bytes(long long n, long long c, long long h, long long w) {
  std::size_t most = 0;
  for (bool cl : {true, false}) {
    const BnGrid g = bn_grid(n, c, h, w, cl);
    most = std::max(
        most, static_cast<std::size_t>(g.chunks * c) * sizeof(double2) + static_cast<std::size_t>(c) * sizeof(float4));
  }
  return most;
}

cudaError_t launch_bn_forward_training(View x, View y, const float* gamma, const float* beta, float* running_mean,
                                       float* running_var, float* save_mean, float* save_invstd, double eps,
                                       double momentum, bool relu, void* scratch, cudaStream_t s) {
  const View v[2] = {x, y};
  cudaError_t err = cudaSuccess;
  if (bn_rows<false>(v, 2, gamma, beta, running_mean, running_var, save_mean, save_invstd, eps, momentum, nullptr,
                     nullptr, 0.0f, relu, scratch, s, err))
    return err;
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
cudaError_t launch_bn_forward_recompute(View x, View y, const float* gamma, const float* beta, const float* save_mean,
                                        const float* save_invstd, bool relu, void* scratch, cudaStream_t s) {
  auto* coef = static_cast<float4*>(scratch);
  bn_saved_coef_k<<<static_cast<unsigned>((x.c + kThreads - 1) / kThreads), kThreads, 0, s>>>(gamma, beta, save_mean,
                                                                                              save_invstd, x.c, coef);
  RowArgs a{};
  a.coef = coef;
  a.relu = relu;
  const View v[2] = {x, y};
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (numel(x) < (1LL << 31) && launch_rows<kBnApply>(a, v, 2, s, err)) return err;
  bn_recompute_k<<<grid_for(numel(x)), kThreads, 0, s>>>(x, y, coef, relu, numel(x));
  return cudaGetLastError();
}
cudaError_t launch_bn_backward(View x, View y, View dy, View dx, const float* gamma, const float* save_mean,
                               const float* save_invstd, float* dgamma, float* dbeta, float beta_dx, bool relu,
                               void* scratch, cudaStream_t s) {
  const View v[4] = {x, y, dy, dx};
  cudaError_t err = cudaSuccess;
  if (bn_rows<true>(v, 4, gamma, nullptr, nullptr, nullptr, const_cast<float*>(save_mean),
                    const_cast<float*>(save_invstd), 0.0, 0.0, dgamma, dbeta, beta_dx, relu, scratch, s, err))
    return err;
  bn_bwd_k<<<static_cast<unsigned>(x.c), kThreads, 0, s>>>(x, y, dy, dx, gamma, save_mean, save_invstd, dgamma, dbeta,
                                                           beta_dx, relu);
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
