// stepbench's own CUDA kernels: elementwise ops, batch norm, pooling, the loss, dropout and the
// optimizer update, over strided 4-D views of fp32, bf16 or fp16 storage, computing in fp32 (and
// double for statistics). The element type is a field of the view: one branch per load and store,
// the same for every thread, instead of three instantiations of every kernel. The formulas mirror src/cpu/cpu_kernels.cpp so
// both backends compute the same thing (the op tests compare both with the oracle).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda/kernels.hpp"

namespace stepbench::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(long long n) {
  const long long b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

__device__ __forceinline__ float ld_t(const void* p, int t, long long i) {
  if (t == kF32) return static_cast<const float*>(p)[i];
  if (t == kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}
__device__ __forceinline__ void st_t(void* p, int t, long long i, float v) {
  if (t == kF32) static_cast<float*>(p)[i] = v;
  else if (t == kBF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
  else static_cast<__half*>(p)[i] = __float2half_rn(v);
}
__device__ __forceinline__ float ld(const View& v, long long off) { return ld_t(v.p, v.t, off); }
__device__ __forceinline__ void st(const View& v, long long off, float x) { st_t(v.p, v.t, off, x); }
__device__ __forceinline__ float ld(const Flat& v, long long i) { return ld_t(v.p, v.t, i); }
__device__ __forceinline__ void st(const Flat& v, long long i, float x) { st_t(v.p, v.t, i, x); }

// Element i of the logical N, C, H, W order -> offset in a view.
__device__ __forceinline__ long long offset_of(const View& v, long long i) {
  const long long w = i % v.w;
  long long t = i / v.w;
  const long long h = t % v.h;
  t /= v.h;
  const long long c = t % v.c;
  const long long n = t / v.c;
  return n * v.sn + c * v.sc + h * v.sh + w * v.sw;
}
__device__ __forceinline__ long long off4(const View& v, long long n, long long c, long long h, long long w) {
  return n * v.sn + c * v.sc + h * v.sh + w * v.sw;
}

#define GRID_STRIDE(i, n) \
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<long long>(blockDim.x) * gridDim.x)

__global__ void fill_k(float* x, float v, std::size_t n) {
  GRID_STRIDE(i, static_cast<long long>(n)) x[i] = v;
}
__global__ void scale_k(float* x, float a, std::size_t n) {
  GRID_STRIDE(i, static_cast<long long>(n)) x[i] *= a;
}
__global__ void add_k(View s, View d, float beta, long long n) {
  GRID_STRIDE(i, n) {
    const float v = ld(s, offset_of(s, i));
    const long long o = offset_of(d, i);
    st(d, o, beta == 0.0f ? v : v + beta * ld(d, o));
  }
}
__global__ void relu_fwd_k(View x, View y, long long n) {
  GRID_STRIDE(i, n) st(y, offset_of(y, i), fmaxf(ld(x, offset_of(x, i)), 0.0f));
}
__global__ void relu_bwd_k(View y, View dy, View dx, float beta, long long n) {
  GRID_STRIDE(i, n) {
    const float v = ld(y, offset_of(y, i)) > 0.0f ? ld(dy, offset_of(dy, i)) : 0.0f;
    const long long o = offset_of(dx, i);
    st(dx, o, beta == 0.0f ? v : v + beta * ld(dx, o));
  }
}

// ---- fast paths: views as rows of contiguous elements ----------------------------------------------
// Every view the graph makes is a dense tensor or a channel slice of one. In channels-last order
// (NHWC: c contiguous) such a view is N*H*W rows of C elements; in NCHW order it is N*C rows of
// H*W elements. Row r starts at (r / r1) * so + (r % r1) * si. Kernels over rows need one 32-bit
// division per vector of elements instead of six 64-bit ones per element, read whole rows with
// 16-byte loads where the alignment allows, and walk memory in order (coalesced).
struct Rows {
  char* p;
  long long len, r1, so, si;  // elements
};

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <class T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

template <class T, int V>
__device__ __forceinline__ Pack<T, V>* at(const Rows& r, unsigned row, unsigned j) {
  const long long off = static_cast<long long>(row / r.r1) * r.so + static_cast<long long>(row % r.r1) * r.si + j;
  return reinterpret_cast<Pack<T, V>*>(r.p + off * static_cast<long long>(sizeof(T)));
}

enum RowOp : int { kRelu, kReluBwd, kAdd, kBnInfer };
struct RowArgs {
  Rows a, b, c;        // relu: x, y; relu backward: y, dy, dx; add: src, dst; bn inference: x, y
  float beta;          // accumulate into the destination (kReluBwd, kAdd)
  const float *gamma, *bnbeta, *mean, *var;
  float eps;
  bool relu, cl;       // bn: fused ReLU; channels-last rows (the channel is the column), else NCHW rows
  unsigned vec_per_row, total, channels;
};

template <class T, int V, int OP>
__global__ void rows_k(RowArgs a) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < a.total; i += blockDim.x * gridDim.x) {
    const unsigned row = i / a.vec_per_row, j = (i - row * a.vec_per_row) * V;
    if (OP == kRelu) {
      const Pack<T, V> x = *at<T, V>(a.a, row, j);
      Pack<T, V> y;
#pragma unroll
      for (int k = 0; k < V; ++k) y.v[k] = from_f<T>(fmaxf(to_f(x.v[k]), 0.0f));
      *at<T, V>(a.b, row, j) = y;
    } else if (OP == kReluBwd) {
      const Pack<T, V> y = *at<T, V>(a.a, row, j), dy = *at<T, V>(a.b, row, j);
      Pack<T, V>* dxp = at<T, V>(a.c, row, j);
      Pack<T, V> dx;
      if (a.beta != 0.0f) dx = *dxp;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float g = to_f(y.v[k]) > 0.0f ? to_f(dy.v[k]) : 0.0f;
        dx.v[k] = from_f<T>(a.beta == 0.0f ? g : g + a.beta * to_f(dx.v[k]));
      }
      *dxp = dx;
    } else if (OP == kAdd) {
      const Pack<T, V> x = *at<T, V>(a.a, row, j);
      Pack<T, V>* dp = at<T, V>(a.b, row, j);
      Pack<T, V> d;
      if (a.beta != 0.0f) d = *dp;
#pragma unroll
      for (int k = 0; k < V; ++k) d.v[k] = from_f<T>(a.beta == 0.0f ? to_f(x.v[k]) : to_f(x.v[k]) + a.beta * to_f(d.v[k]));
      *dp = d;
    } else {  // kBnInfer
      const Pack<T, V> x = *at<T, V>(a.a, row, j);
      Pack<T, V> y;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const unsigned c = a.cl ? j + k : row % a.channels;
        const float sc = a.gamma[c] / sqrtf(a.var[c] + a.eps);
        const float v = sc * (to_f(x.v[k]) - a.mean[c]) + a.bnbeta[c];
        y.v[k] = from_f<T>(a.relu ? fmaxf(v, 0.0f) : v);
      }
      *at<T, V>(a.b, row, j) = y;
    }
  }
}

// The rows of v in the given order, or false when v is not such a view.
bool as_rows(const View& v, bool cl, Rows& r) {
  r.p = static_cast<char*>(v.p);
  if (cl) {
    if (v.sc != 1 || v.sh != v.w * v.sw) return false;
    r.len = v.c;
    r.r1 = v.h * v.w;
    r.so = v.sn;
    r.si = v.sw;
  } else {
    if (v.sw != 1 || v.sh != v.w) return false;
    r.len = v.h * v.w;
    r.r1 = v.c;
    r.so = v.sn;
    r.si = v.sc;
  }
  return true;
}

template <int OP, class T>
cudaError_t launch_rows_t(RowArgs a, int n_views, long long rows, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const Rows* views[3] = {&a.a, &a.b, &a.c};
  bool vec = a.a.len % V == 0;
  for (int k = 0; k < n_views && vec; ++k) {
    const Rows& r = *views[k];
    vec = reinterpret_cast<std::uintptr_t>(r.p) % 16 == 0 && r.so % V == 0 && r.si % V == 0;
  }
  const unsigned vpr = static_cast<unsigned>(vec ? a.a.len / V : a.a.len);
  const unsigned long long total = static_cast<unsigned long long>(vpr) * static_cast<unsigned long long>(rows);
  a.vec_per_row = vpr;
  a.total = static_cast<unsigned>(total);
  if (total == 0) return cudaSuccess;
  const unsigned blocks = grid_for(static_cast<long long>(total));
  if (vec)
    rows_k<T, V, OP><<<blocks, kThreads, 0, s>>>(a);
  else
    rows_k<T, 1, OP><<<blocks, kThreads, 0, s>>>(a);
  return cudaGetLastError();
}

// Runs OP over rows when every view has them in the same order and one element type; returns
// false (nothing launched) otherwise, and the caller runs the generic kernel.
template <int OP>
bool launch_rows(RowArgs a, const View* v, int n_views, cudaStream_t s, cudaError_t& err) {
  const bool cl = v[n_views - 1].sc == 1 && v[n_views - 1].c > 1;  // the destination's order
  Rows* rs[3] = {&a.a, &a.b, &a.c};
  for (int k = 0; k < n_views; ++k) {
    if (v[k].t != v[0].t || v[k].n != v[0].n || v[k].c != v[0].c || v[k].h != v[0].h || v[k].w != v[0].w) return false;
    if (!as_rows(v[k], cl, *rs[k])) return false;
  }
  const long long rows = cl ? v[0].n * v[0].h * v[0].w : v[0].n * v[0].c;
  const unsigned long long total = static_cast<unsigned long long>(rows) * static_cast<unsigned long long>(a.a.len);
  if (total >= (1ULL << 31)) return false;
  a.cl = cl;
  a.channels = static_cast<unsigned>(v[0].c);
  if (v[0].t == kF32) err = launch_rows_t<OP, float>(a, n_views, rows, s);
  else if (v[0].t == kBF16) err = launch_rows_t<OP, __nv_bfloat16>(a, n_views, rows, s);
  else err = launch_rows_t<OP, __half>(a, n_views, rows, s);
  return true;
}

// Average pooling over channels-last views: one thread per output (input, for the backward) pixel
// and V channels, 16-byte loads, 32-bit index arithmetic. The backward gathers from the outputs
// whose windows cover the pixel (no atomics, deterministic).
template <class T, int V>
__device__ __forceinline__ Pack<T, V>* pix(const View& v, int b, int h, int w, int c) {
  const long long off = b * v.sn + h * v.sh + w * v.sw + c;
  return reinterpret_cast<Pack<T, V>*>(static_cast<T*>(v.p) + off);
}
__device__ __forceinline__ float window_inv(const PoolArgs& p, int H, int W, int oh, int ow, int& h0, int& h1, int& w0,
                                            int& w1) {
  const int hs = oh * p.sh - p.ph, ws = ow * p.sw - p.pw;
  const int he = min(hs + p.kh, H + p.ph), we = min(ws + p.kw, W + p.pw);
  const int padded = (he - hs) * (we - ws);
  h0 = max(hs, 0);
  h1 = min(he, H);
  w0 = max(ws, 0);
  w1 = min(we, W);
  const int count = p.kind == 2 ? (h1 - h0) * (w1 - w0) : padded;
  return count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
}
template <class T, int V>
__global__ void avgpool_cl_fwd_k(View x, View y, PoolArgs p, unsigned total, unsigned cv) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    const unsigned px = i / cv, c = (i - px * cv) * V;
    const int ow = px % y.w, oh = (px / y.w) % y.h, b = px / (y.w * y.h);
    int h0, h1, w0, w1;
    const float inv = window_inv(p, static_cast<int>(x.h), static_cast<int>(x.w), oh, ow, h0, h1, w0, w1);
    float acc[V] = {};
    for (int h = h0; h < h1; ++h)
      for (int w = w0; w < w1; ++w) {
        const Pack<T, V> v = *pix<T, V>(x, b, h, w, c);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_f(v.v[k]);
      }
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_f<T>(acc[k] * inv);
    *pix<T, V>(y, b, oh, ow, c) = out;
  }
}
template <class T, int V>
__global__ void avgpool_cl_bwd_k(View dy, View dx, PoolArgs p, float beta, unsigned total, unsigned cv) {
  const int H = static_cast<int>(dx.h), W = static_cast<int>(dx.w), OH = static_cast<int>(dy.h),
            OW = static_cast<int>(dy.w);
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    const unsigned px = i / cv, c = (i - px * cv) * V;
    const int w = px % W, h = (px / W) % H, b = px / (W * H);
    // the outputs whose windows hold (h, w)
    const int nh = h + p.ph - p.kh + 1, nw = w + p.pw - p.kw + 1;
    const int oh0 = nh <= 0 ? 0 : (nh + p.sh - 1) / p.sh, oh1 = min((h + p.ph) / p.sh + 1, OH);
    const int ow0 = nw <= 0 ? 0 : (nw + p.sw - 1) / p.sw, ow1 = min((w + p.pw) / p.sw + 1, OW);
    float acc[V] = {};
    for (int oh = oh0; oh < oh1; ++oh)
      for (int ow = ow0; ow < ow1; ++ow) {
        int h0, h1, w0, w1;
        const float inv = window_inv(p, H, W, oh, ow, h0, h1, w0, w1);
        const Pack<T, V> g = *pix<T, V>(dy, b, oh, ow, c);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += inv * to_f(g.v[k]);
      }
    Pack<T, V>* o = pix<T, V>(dx, b, h, w, c);
    Pack<T, V> out;
    if (beta != 0.0f) out = *o;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_f<T>(beta == 0.0f ? acc[k] : acc[k] + beta * to_f(out.v[k]));
    *o = out;
  }
}
bool cl_view(const View& v) { return v.sc == 1 && v.sh == v.w * v.sw; }
bool vec_ok(const View& v, int V) {
  return reinterpret_cast<std::uintptr_t>(v.p) % 16 == 0 && v.c % V == 0 && v.sn % V == 0 && v.sh % V == 0 &&
         v.sw % V == 0;
}
// Average pooling on channels-last views (forward: a = x, b = y; backward: a = dy, b = dx), or
// false when the views are not such.
template <bool FWD>
bool launch_avgpool_cl(View a, View b, PoolArgs p, float beta, cudaStream_t s, cudaError_t& err) {
  if (p.kind == 0 || !cl_view(a) || !cl_view(b) || a.t != b.t) return false;
  const View& px = b;  // the pixels a thread owns: outputs (forward) or inputs (backward)
  const unsigned long long pixels = static_cast<unsigned long long>(px.n * px.h * px.w);
  if (pixels * static_cast<unsigned long long>(px.c) >= (1ULL << 31)) return false;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const bool vec = vec_ok(a, V) && vec_ok(b, V);
    const unsigned cv = static_cast<unsigned>(vec ? px.c / V : px.c), total = static_cast<unsigned>(pixels * cv);
    if (total == 0) return;
    if (FWD) {
      if (vec) avgpool_cl_fwd_k<T, V><<<grid_for(total), kThreads, 0, s>>>(a, b, p, total, cv);
      else avgpool_cl_fwd_k<T, 1><<<grid_for(total), kThreads, 0, s>>>(a, b, p, total, cv);
    } else {
      if (vec) avgpool_cl_bwd_k<T, V><<<grid_for(total), kThreads, 0, s>>>(a, b, p, beta, total, cv);
      else avgpool_cl_bwd_k<T, 1><<<grid_for(total), kThreads, 0, s>>>(a, b, p, beta, total, cv);
    }
  };
  if (a.t == kF32) go(float{});
  else if (a.t == kBF16) go(__nv_bfloat16{});
  else go(__half{});
  err = cudaGetLastError();
  return true;
}

// ---- batch norm -----------------------------------------------------------------------------------
template <class T>
__device__ T block_sum(T v) {
  __shared__ T buf[kThreads];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  const T r = buf[0];
  __syncthreads();
  return r;
}

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
    const float a = static_cast<float>(gamma[c] * invstd), b = static_cast<float>(beta[c] - rmean[c] * gamma[c] * invstd);
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

// ---- pooling -------------------------------------------------------------------------------------
__device__ void window(const PoolArgs& p, long long H, long long W, long long oh, long long ow, long long& h0,
                       long long& h1, long long& w0, long long& w1, float& inv) {
  const long long hs = oh * p.sh - p.ph, ws = ow * p.sw - p.pw;
  const long long he = min(hs + p.kh, H + p.ph), we = min(ws + p.kw, W + p.pw);
  const long long padded = (he - hs) * (we - ws);
  h0 = max(hs, 0LL);
  h1 = min(he, H);
  w0 = max(ws, 0LL);
  w1 = min(we, W);
  const long long count = p.kind == 2 ? (h1 - h0) * (w1 - w0) : padded;
  inv = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
}

// The window's maximum and where it is (h * W + w): PyTorch's rule, the first max wins and NaN
// propagates.
__device__ __forceinline__ float window_max(const View& x, long long b, long long c, long long h0, long long h1,
                                            long long w0, long long w1, std::int32_t& pos) {
  float best = -INFINITY;
  pos = static_cast<std::int32_t>(h0 * x.w + w0);
  for (long long h = h0; h < h1; ++h)
    for (long long w = w0; w < w1; ++w) {
      const float v = ld(x, off4(x, b, c, h, w));
      if (v > best || isnan(v)) {
        best = v;
        pos = static_cast<std::int32_t>(h * x.w + w);
      }
    }
  return best;
}

// Element i in memory order: (b, h, w, c) with c fastest for channels-last views (coalesced NHWC
// reads and writes), else (b, c, h, w).
__device__ __forceinline__ void split4(const View& v, bool cl, long long i, long long& b, long long& c, long long& h,
                                       long long& w) {
  if (cl) {
    c = i % v.c;
    i /= v.c;
    w = i % v.w;
    i /= v.w;
    h = i % v.h;
    b = i / v.h;
  } else {
    w = i % v.w;
    i /= v.w;
    h = i % v.h;
    i /= v.h;
    c = i % v.c;
    b = i / v.c;
  }
}

__global__ void pool_fwd_k(View x, View y, PoolArgs p, std::int32_t* argmax, long long n, bool cl) {
  GRID_STRIDE(i, n) {
    long long b, c, oh, ow;
    split4(y, cl, i, b, c, oh, ow);
    long long h0, h1, w0, w1;
    float inv;
    window(p, x.h, x.w, oh, ow, h0, h1, w0, w1, inv);
    if (p.kind == 0) {
      std::int32_t pos;
      st(y, off4(y, b, c, oh, ow), window_max(x, b, c, h0, h1, w0, w1, pos));
      if (argmax) argmax[((b * y.c + c) * y.h + oh) * y.w + ow] = pos;
    } else {
      float s = 0;
      for (long long h = h0; h < h1; ++h)
        for (long long w = w0; w < w1; ++w) s += ld(x, off4(x, b, c, h, w));
      st(y, off4(y, b, c, oh, ow), s * inv);
    }
  }
}

__device__ __forceinline__ void covering(long long i, int k, int s, int pad, long long out, long long& o0,
                                         long long& o1) {
  const long long num = i + pad - k + 1;
  o0 = num <= 0 ? 0 : (num + s - 1) / s;
  o1 = min((i + pad) / s + 1, out);
}

// Gather: each input element sums the outputs whose windows cover it, so no two threads write one
// element. Max pool routes each output's gradient to its window's argmax: the forward's, or found
// again in x when there is none (argmax null).
__global__ void pool_bwd_k(View x, View dy, View dx, PoolArgs p, float beta, const std::int32_t* argmax, long long n,
                          bool cl) {
  GRID_STRIDE(i, n) {
    long long b, c, h, w;
    split4(dx, cl, i, b, c, h, w);
    long long oh0, oh1, ow0, ow1;
    covering(h, p.kh, p.sh, p.ph, dy.h, oh0, oh1);
    covering(w, p.kw, p.sw, p.pw, dy.w, ow0, ow1);
    const auto pos = static_cast<std::int32_t>(h * dx.w + w);
    float acc = 0;
    for (long long oh = oh0; oh < oh1; ++oh)
      for (long long ow = ow0; ow < ow1; ++ow) {
        const float g = ld(dy, off4(dy, b, c, oh, ow));
        long long h0, h1, w0, w1;
        float inv;
        window(p, dx.h, dx.w, oh, ow, h0, h1, w0, w1, inv);
        if (p.kind == 0) {
          std::int32_t at;
          if (argmax)
            at = argmax[((b * dy.c + c) * dy.h + oh) * dy.w + ow];
          else
            window_max(x, b, c, h0, h1, w0, w1, at);
          if (at == pos) acc += g;
        } else {
          acc += inv * g;
        }
      }
    const long long o = off4(dx, b, c, h, w);
    st(dx, o, beta == 0.0f ? acc : acc + beta * ld(dx, o));
  }
}

// ---- fully connected helpers, dropout, loss, optimizers -------------------------------------------
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

// One block per sample.
__global__ void xent_rows_k(Flat z, const std::int32_t* labels, float* probs, float* row_loss, int* bad,
                            long long M) {
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

__global__ void cast_k(Flat src, Flat dst, long long n) {
  GRID_STRIDE(i, n) st(dst, i, ld(src, i));
}
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

long long numel(const View& v) { return v.n * v.c * v.h * v.w; }

}  // namespace

cudaError_t launch_fill(float* x, float v, std::size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  fill_k<<<grid_for(static_cast<long long>(n)), kThreads, 0, s>>>(x, v, n);
  return cudaGetLastError();
}
cudaError_t launch_scale(float* x, float a, std::size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  scale_k<<<grid_for(static_cast<long long>(n)), kThreads, 0, s>>>(x, a, n);
  return cudaGetLastError();
}
cudaError_t launch_add(View src, View dst, float beta, cudaStream_t s) {
  RowArgs a{};
  a.beta = beta;
  const View v[2] = {src, dst};
  cudaError_t err = cudaSuccess;
  if (launch_rows<kAdd>(a, v, 2, s, err)) return err;
  add_k<<<grid_for(numel(dst)), kThreads, 0, s>>>(src, dst, beta, numel(dst));
  return cudaGetLastError();
}
cudaError_t launch_relu_forward(View x, View y, cudaStream_t s) {
  RowArgs a{};
  const View v[2] = {x, y};
  cudaError_t err = cudaSuccess;
  if (launch_rows<kRelu>(a, v, 2, s, err)) return err;
  relu_fwd_k<<<grid_for(numel(y)), kThreads, 0, s>>>(x, y, numel(y));
  return cudaGetLastError();
}
cudaError_t launch_relu_backward(View y, View dy, View dx, float beta, cudaStream_t s) {
  RowArgs a{};
  a.beta = beta;
  const View v[3] = {y, dy, dx};
  cudaError_t err = cudaSuccess;
  if (launch_rows<kReluBwd>(a, v, 3, s, err)) return err;
  relu_bwd_k<<<grid_for(numel(dx)), kThreads, 0, s>>>(y, dy, dx, beta, numel(dx));
  return cudaGetLastError();
}
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
cudaError_t launch_pool_forward(View x, View y, PoolArgs p, std::int32_t* argmax, cudaStream_t s) {
  cudaError_t err = cudaSuccess;
  if (launch_avgpool_cl<true>(x, y, p, 0.0f, s, err)) return err;
  pool_fwd_k<<<grid_for(numel(y)), kThreads, 0, s>>>(x, y, p, argmax, numel(y), y.sc == 1 && y.c > 1);
  return cudaGetLastError();
}
cudaError_t launch_pool_backward(View x, View dy, View dx, PoolArgs p, float beta, const std::int32_t* argmax,
                                 cudaStream_t s) {
  cudaError_t err = cudaSuccess;
  if (launch_avgpool_cl<false>(dy, dx, p, beta, s, err)) return err;
  pool_bwd_k<<<grid_for(numel(dx)), kThreads, 0, s>>>(x, dy, dx, p, beta, argmax, numel(dx), dx.sc == 1 && dx.c > 1);
  return cudaGetLastError();
}
cudaError_t launch_add_bias(Flat y, Flat b, long long N, long long M, cudaStream_t s) {
  add_bias_k<<<grid_for(N * M), kThreads, 0, s>>>(y, b, N, M);
  return cudaGetLastError();
}
cudaError_t launch_bias_grad(Flat dy, Flat db, long long N, long long M, cudaStream_t s) {
  bias_grad_k<<<grid_for(M), kThreads, 0, s>>>(dy, db, N, M);
  return cudaGetLastError();
}
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
cudaError_t launch_optimizer_update(OptArgs a, float* params, const float* grads, float* s0, float* s1, std::size_t n,
                                    const float* scaler, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  opt_k<<<grid_for(static_cast<long long>(n)), kThreads, 0, s>>>(a, params, grads, s0, s1, static_cast<long long>(n),
                                                                  scaler);
  return cudaGetLastError();
}
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
