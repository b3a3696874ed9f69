// A convolution's bias and ReLU (BiasActOp), the clipped ReLU (ReLU6), and adaptive average pooling,
// over views of any strides: the formulas of src/backend/cpu/bias_act.cpp, elementwise.cpp and
// adaptive_pool.cpp. The bias gradient is one block per channel summing its N x H x W gradients.
#include "backend/cuda/kernels_common.cuh"

namespace stepbench::cuda {
namespace {

__global__ void bias_act_fwd_k(View y, const float* b, bool relu, long long n) {
  GRID_STRIDE(i, n) {
    const long long o = offset_of(y, i);
    const float v = ld(y, o) + b[(i / (y.h * y.w)) % y.c];
    st(y, o, relu ? fmaxf(v, 0.0f) : v);
  }
}
// one block per channel: g written to dx, its sum to db[c]
__global__ void bias_act_bwd_k(View y, View dy, View dx, float beta, float* db, bool relu) {
  const long long c = blockIdx.x, hw = y.h * y.w, per = y.n * hw;
  float sum = 0.0f;
  for (long long j = threadIdx.x; j < per; j += blockDim.x) {
    const long long n = j / hw, h = (j % hw) / y.w, w = j % y.w;
    const float g = !relu || ld(y, off4(y, n, c, h, w)) > 0.0f ? ld(dy, off4(dy, n, c, h, w)) : 0.0f;
    sum += g;
    const long long o = off4(dx, n, c, h, w);
    st(dx, o, beta == 0.0f ? g : g + beta * ld(dx, o));
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) db[c] = sum;
}

__global__ void relu_clip_fwd_k(View x, View y, float clip, long long n) {
  GRID_STRIDE(i, n) st(y, offset_of(y, i), fminf(fmaxf(ld(x, offset_of(x, i)), 0.0f), clip));
}
__global__ void relu_clip_bwd_k(View y, View dy, View dx, float beta, float clip, long long n) {
  GRID_STRIDE(i, n) {
    const float yv = ld(y, offset_of(y, i));
    const float v = yv > 0.0f && yv < clip ? ld(dy, offset_of(dy, i)) : 0.0f;
    const long long o = offset_of(dx, i);
    st(dx, o, beta == 0.0f ? v : v + beta * ld(dx, o));
  }
}

__device__ __forceinline__ long long span_lo(long long o, long long in, long long out) { return o * in / out; }
__device__ __forceinline__ long long span_hi(long long o, long long in, long long out) {
  return ((o + 1) * in + out - 1) / out;
}
__global__ void adaptive_avg_fwd_k(View x, View y, long long n) {
  GRID_STRIDE(i, n) {
    const long long ow = i % y.w, oh = (i / y.w) % y.h, c = (i / (y.w * y.h)) % y.c, b = i / (y.w * y.h * y.c);
    const long long h0 = span_lo(oh, x.h, y.h), h1 = span_hi(oh, x.h, y.h);
    const long long w0 = span_lo(ow, x.w, y.w), w1 = span_hi(ow, x.w, y.w);
    float sum = 0.0f;
    for (long long h = h0; h < h1; ++h)
      for (long long w = w0; w < w1; ++w) sum += ld(x, off4(x, b, c, h, w));
    st(y, off4(y, b, c, oh, ow), sum / static_cast<float>((h1 - h0) * (w1 - w0)));
  }
}
// per input element: the windows that cover it (a gather, no atomics)
__global__ void adaptive_avg_bwd_k(View dy, View dx, float beta, long long n) {
  GRID_STRIDE(i, n) {
    const long long w = i % dx.w, h = (i / dx.w) % dx.h, c = (i / (dx.w * dx.h)) % dx.c, b = i / (dx.w * dx.h * dx.c);
    float g = 0.0f;
    for (long long oh = 0; oh < dy.h; ++oh) {
      const long long h0 = span_lo(oh, dx.h, dy.h), h1 = span_hi(oh, dx.h, dy.h);
      if (h < h0 || h >= h1) continue;
      for (long long ow = 0; ow < dy.w; ++ow) {
        const long long w0 = span_lo(ow, dx.w, dy.w), w1 = span_hi(ow, dx.w, dy.w);
        if (w < w0 || w >= w1) continue;
        g += ld(dy, off4(dy, b, c, oh, ow)) / static_cast<float>((h1 - h0) * (w1 - w0));
      }
    }
    const long long o = off4(dx, b, c, h, w);
    st(dx, o, beta == 0.0f ? g : g + beta * ld(dx, o));
  }
}

}  // namespace

cudaError_t launch_bias_act_forward(View y, const float* b, bool relu, cudaStream_t s) {
  bias_act_fwd_k<<<grid_for(numel(y)), kThreads, 0, s>>>(y, b, relu, numel(y));
  return cudaGetLastError();
}
cudaError_t launch_bias_act_backward(View y, View dy, View dx, float beta, float* db, bool relu, cudaStream_t s) {
  if (y.c == 0) return cudaSuccess;
  bias_act_bwd_k<<<static_cast<unsigned>(y.c), kThreads, 0, s>>>(y, dy, dx, beta, db, relu);
  return cudaGetLastError();
}
cudaError_t launch_relu_clip_forward(View x, View y, float clip, cudaStream_t s) {
  relu_clip_fwd_k<<<grid_for(numel(y)), kThreads, 0, s>>>(x, y, clip, numel(y));
  return cudaGetLastError();
}
cudaError_t launch_relu_clip_backward(View y, View dy, View dx, float beta, float clip, cudaStream_t s) {
  relu_clip_bwd_k<<<grid_for(numel(dx)), kThreads, 0, s>>>(y, dy, dx, beta, clip, numel(dx));
  return cudaGetLastError();
}
cudaError_t launch_adaptive_avg_pool_forward(View x, View y, cudaStream_t s) {
  adaptive_avg_fwd_k<<<grid_for(numel(y)), kThreads, 0, s>>>(x, y, numel(y));
  return cudaGetLastError();
}
cudaError_t launch_adaptive_avg_pool_backward(View dy, View dx, float beta, cudaStream_t s) {
  adaptive_avg_bwd_k<<<grid_for(numel(dx)), kThreads, 0, s>>>(dy, dx, beta, numel(dx));
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
