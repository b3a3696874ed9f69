// Pooling kernels: max and average (padding counted or not), forward and backward, over strided
// views in the views' memory order, and a vectorised average pooling for channels-last views.
// The formulas mirror src/backend/cpu/cpu_kernels.cpp.
#include "backend/cuda/kernels_common.cuh"

namespace stepbench::cuda {
namespace {

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
      if (vec)
        avgpool_cl_fwd_k<T, V><<<grid_for(total), kThreads, 0, s>>>(a, b, p, total, cv);
      else
        avgpool_cl_fwd_k<T, 1><<<grid_for(total), kThreads, 0, s>>>(a, b, p, total, cv);
    } else {
      if (vec)
        avgpool_cl_bwd_k<T, V><<<grid_for(total), kThreads, 0, s>>>(a, b, p, beta, total, cv);
      else
        avgpool_cl_bwd_k<T, 1><<<grid_for(total), kThreads, 0, s>>>(a, b, p, beta, total, cv);
    }
  };
  if (a.t == kF32)
    go(float{});
  else if (a.t == kBF16)
    go(__nv_bfloat16{});
  else
    go(__half{});
  err = cudaGetLastError();
  return true;
}

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

}  // namespace

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

}  // namespace stepbench::cuda
