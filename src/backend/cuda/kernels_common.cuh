// What every kernel file shares: the launch shape, loads and stores of fp32, bf16 or fp16 storage
// as fp32 (the element type is a field of the view: one branch per load and store, the same for
// every thread, instead of three instantiations of every kernel), view offsets, 16-byte packs and
// a block-wide sum. Only the kernel files (.cu) include this.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels.hpp"

namespace stepbench::cuda {

constexpr int kThreads = 256;

inline unsigned grid_for(long long n) {
  const long long b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

__device__ __forceinline__ float ld_t(const void* p, int t, long long i) {
  if (t == kF32) return static_cast<const float*>(p)[i];
  if (t == kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}
__device__ __forceinline__ void st_t(void* p, int t, long long i, float v) {
  if (t == kF32)
    static_cast<float*>(p)[i] = v;
  else if (t == kBF16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
  else
    static_cast<__half*>(p)[i] = __float2half_rn(v);
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

#define GRID_STRIDE(i, n)                                                                    \
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<long long>(blockDim.x) * gridDim.x)

// V elements of T in one aligned load or store (16 bytes where V = 16 / sizeof(T)).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <class T>
__device__ __forceinline__ float to_f(T x);
template <>
__device__ __forceinline__ float to_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_f<__half>(__half x) {
  return __half2float(x);
}
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

// The sum over the block of every thread's v, returned to every thread (blockDim.x <= kThreads).
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

inline long long numel(const View& v) { return v.n * v.c * v.h * v.w; }

}  // namespace stepbench::cuda
