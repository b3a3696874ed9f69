// The input pipeline's image transforms on the device (--decode gpu; kernels.hpp): the same
// arithmetic as src/data/augment.cpp, operation for operation (the taps in double, the sums in float
// in the same order, no fused multiply-adds: __fmul_rn / __fadd_rn keep nvcc from contracting), so
// that from the same decoded pixels both give the same floats, bit for bit.
#include <cmath>

#include "backend/cuda/kernels.hpp"
#include "backend/cuda/kernels_common.cuh"

namespace stepbench::cuda {
namespace {

// One axis of the resize to the stored size (augment.cpp's make_taps): output i's window [lo, hi)
// of the input, at most n taps, and the float sum of its raw weights (in double, as there).
struct Axis {
  double scale, support, c;
  int lo, hi, n;
  double sum;
};
__device__ __forceinline__ float raw_weight(const Axis& a, int j) {
  const double x = fabs((j + 0.5 - a.c) / a.support);
  return static_cast<float>(x < 1 ? 1 - x : 0);
}
__device__ Axis axis_of(int L, int Lv, int off, int i) {
  Axis a;
  a.scale = static_cast<double>(L) / Lv;
  a.support = fmax(1.0, a.scale);
  a.n = static_cast<int>(ceil(a.support)) * 2 + 1;
  a.c = (i + off + 0.5) * a.scale;
  a.lo = max(0, static_cast<int>(floor(a.c - a.support)));
  a.hi = min(L, static_cast<int>(ceil(a.c + a.support)));
  a.sum = 0;
  for (int j = a.lo; j < a.hi && j - a.lo < a.n; ++j) a.sum += raw_weight(a, j);
  if (a.sum <= 0) a.sum = -1;  // augment.cpp's guard: the first tap alone, weight 1
  return a;
}
__device__ __forceinline__ float weight(const Axis& a, int j) {
  if (a.sum < 0) return j == a.lo ? 1.0f : 0.0f;
  return static_cast<float>(raw_weight(a, j) / a.sum);
}

// One thread per stored pixel (x, y) of image blockIdx.z: the horizontal sums of the rows its
// vertical taps read, then the vertical sum, rounded to 8 bits.
__global__ void resize_store_k(const ImageIn* in, int R, unsigned char* out) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= R || y >= R) return;
  const ImageIn im = in[blockIdx.z];
  const int W = im.w, H = im.h;
  const double s = static_cast<double>(R) / min(W, H);
  const int Wv = max(R, static_cast<int>(llround(W * s))), Hv = max(R, static_cast<int>(llround(H * s)));
  const Axis ax = axis_of(W, Wv, (Wv - R) / 2, x), ay = axis_of(H, Hv, (Hv - R) / 2, y);
  float acc[3] = {0, 0, 0};
  for (int j = ay.lo; j < ay.hi && j - ay.lo < ay.n; ++j) {
    const float wy = weight(ay, j);
    if (wy == 0.0f) continue;  // augment.cpp leaves the triangle's feet out
    const unsigned char* row = im.px + static_cast<size_t>(j) * im.pitch;
    float t[3] = {0, 0, 0};
    for (int m = ax.lo; m < ax.hi && m - ax.lo < ax.n; ++m) {
      const float wx = weight(ax, m);
      if (wx == 0.0f) continue;
      for (int k = 0; k < 3; ++k) t[k] = __fadd_rn(t[k], __fmul_rn(wx, static_cast<float>(row[m * 3 + k])));
    }
    for (int k = 0; k < 3; ++k) acc[k] = __fadd_rn(acc[k], __fmul_rn(wy, t[k]));
  }
  unsigned char* o = out + (static_cast<size_t>(blockIdx.z) * R * R + static_cast<size_t>(y) * R + x) * 3;
  for (int k = 0; k < 3; ++k) o[k] = static_cast<unsigned char>(fminf(fmaxf(__fadd_rn(acc[k], 0.5f), 0.0f), 255.0f));
}

// One thread per output pixel (x, y) of slot blockIdx.z: the crop box's bilinear sample (pixel
// centres), flipped, normalised, into the batch tensor.
__global__ void crop_normalise_k(const unsigned char* stored, int R, const CropIn* crops, int S, NormIn nrm, View out) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= S || y >= S) return;
  const CropIn b = crops[blockIdx.z];
  const unsigned char* src = stored + static_cast<size_t>(blockIdx.z) * R * R * 3;
  const double sx = fmin(fmax((x + 0.5) * b.w / S - 0.5, 0.0), b.w - 1.0);
  const int x0 = static_cast<int>(sx), x1 = min(x0 + 1, b.w - 1);
  const float wx = static_cast<float>(sx - x0);
  const double sy = fmin(fmax((y + 0.5) * b.h / S - 0.5, 0.0), b.h - 1.0);
  const int y0 = static_cast<int>(sy), y1 = min(y0 + 1, b.h - 1);
  const float wy = static_cast<float>(sy - y0);
  const unsigned char* r0 = src + static_cast<size_t>(b.y + y0) * R * 3;
  const unsigned char* r1 = src + static_cast<size_t>(b.y + y1) * R * 3;
  const int a = (b.x + x0) * 3, c = (b.x + x1) * 3;
  const int xo = b.flip ? S - 1 - x : x;
  float* dst = static_cast<float*>(out.p) + b.slot * out.sn;
  for (int k = 0; k < 3; ++k) {
    const float top =
        __fadd_rn(static_cast<float>(r0[a + k]), __fmul_rn(wx, static_cast<float>(r0[c + k] - r0[a + k])));
    const float bot =
        __fadd_rn(static_cast<float>(r1[a + k]), __fmul_rn(wx, static_cast<float>(r1[c + k] - r1[a + k])));
    const float v = __fadd_rn(top, __fmul_rn(wy, __fsub_rn(bot, top)));
    dst[k * out.sc + y * out.sh + xo * out.sw] = __fadd_rn(__fmul_rn(v, nrm.scale[k]), nrm.shift[k]);
  }
}

}  // namespace

cudaError_t launch_resize_store(const ImageIn* in, int n, int R, unsigned char* out, cudaStream_t s) {
  const dim3 block(32, 8), grid((R + 31) / 32, (R + 7) / 8, static_cast<unsigned>(n));
  resize_store_k<<<grid, block, 0, s>>>(in, R, out);
  return cudaGetLastError();
}

cudaError_t launch_crop_normalise(const unsigned char* stored, int R, const CropIn* crops, int n, int S, NormIn nrm,
                                  View out, cudaStream_t s) {
  const dim3 block(32, 8), grid((S + 31) / 32, (S + 7) / 8, static_cast<unsigned>(n));
  crop_normalise_k<<<grid, block, 0, s>>>(stored, R, crops, S, nrm, out);
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
