// Elementwise kernels over strided views: fill, scale, accumulation (dst = src + beta * dst), the
// ReLU and its backward, and the residual add + ReLU and its backward. Views that are rows of contiguous elements take
// the row kernels (kernels_rows.cu); any other view the generic kernels here.
#include "backend/cuda/kernels_rows.cuh"

namespace stepbench::cuda {
namespace {

__global__ void fill_k(float* x, float v, std::size_t n) { GRID_STRIDE(i, static_cast<long long>(n)) x[i] = v; }
__global__ void scale_k(float* x, float a, std::size_t n) { GRID_STRIDE(i, static_cast<long long>(n)) x[i] *= a; }
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

__global__ void add_relu_fwd_k(View a, View b, View y, long long n) {
  GRID_STRIDE(i, n) st(y, offset_of(y, i), fmaxf(ld(a, offset_of(a, i)) + ld(b, offset_of(b, i)), 0.0f));
}
__global__ void add_relu_bwd_k(View y, View dy, View da, float beta_a, View db, float beta_b, long long n) {
  GRID_STRIDE(i, n) {
    const float g = ld(y, offset_of(y, i)) > 0.0f ? ld(dy, offset_of(dy, i)) : 0.0f;
    const long long oa = offset_of(da, i), ob = offset_of(db, i);
    st(da, oa, beta_a == 0.0f ? g : g + beta_a * ld(da, oa));
    st(db, ob, beta_b == 0.0f ? g : g + beta_b * ld(db, ob));
  }
}

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

cudaError_t launch_add_relu_forward(View a, View b, View y, cudaStream_t s) {
  RowArgs r{};
  const View v[3] = {a, b, y};
  cudaError_t err = cudaSuccess;
  if (launch_rows<kAddRelu>(r, v, 3, s, err)) return err;
  add_relu_fwd_k<<<grid_for(numel(y)), kThreads, 0, s>>>(a, b, y, numel(y));
  return cudaGetLastError();
}
cudaError_t launch_add_relu_backward(View y, View dy, View da, float beta_a, View db, float beta_b, cudaStream_t s) {
  RowArgs r{};
  r.beta = beta_a;
  r.beta2 = beta_b;
  const View v[4] = {y, dy, da, db};
  cudaError_t err = cudaSuccess;
  if (launch_rows<kAddReluBwd>(r, v, 4, s, err)) return err;
  add_relu_bwd_k<<<grid_for(numel(y)), kThreads, 0, s>>>(y, dy, da, beta_a, db, beta_b, numel(y));
  return cudaGetLastError();
}

}  // namespace stepbench::cuda
