// The row kernels behind the elementwise fast path (kernels_rows.cuh): one kernel template over
// the element type, the vector width and the op.
#include "backend/cuda/kernels_rows.cuh"

namespace stepbench::cuda {
namespace {

template <class T, int V>
__device__ __forceinline__ Pack<T, V>* at(const Rows& r, unsigned row, unsigned j) {
  const long long off = static_cast<long long>(row / r.r1) * r.so + static_cast<long long>(row % r.r1) * r.si + j;
  return reinterpret_cast<Pack<T, V>*>(r.p + off * static_cast<long long>(sizeof(T)));
}

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
      for (int k = 0; k < V; ++k)
        d.v[k] = from_f<T>(a.beta == 0.0f ? to_f(x.v[k]) : to_f(x.v[k]) + a.beta * to_f(d.v[k]));
      *dp = d;
    } else if (OP == kAddRelu) {
      const Pack<T, V> x = *at<T, V>(a.a, row, j), z = *at<T, V>(a.b, row, j);
      Pack<T, V> y;
#pragma unroll
      for (int k = 0; k < V; ++k) y.v[k] = from_f<T>(fmaxf(to_f(x.v[k]) + to_f(z.v[k]), 0.0f));
      *at<T, V>(a.c, row, j) = y;
    } else if (OP == kAddReluBwd) {
      const Pack<T, V> y = *at<T, V>(a.a, row, j), dy = *at<T, V>(a.b, row, j);
      Pack<T, V>*dap = at<T, V>(a.c, row, j), *dbp = at<T, V>(a.d, row, j);
      Pack<T, V> da, db;
      if (a.beta != 0.0f) da = *dap;
      if (a.beta2 != 0.0f) db = *dbp;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float g = to_f(y.v[k]) > 0.0f ? to_f(dy.v[k]) : 0.0f;
        da.v[k] = from_f<T>(a.beta == 0.0f ? g : g + a.beta * to_f(da.v[k]));
        db.v[k] = from_f<T>(a.beta2 == 0.0f ? g : g + a.beta2 * to_f(db.v[k]));
      }
      *dap = da;
      *dbp = db;
    } else if (OP == kBnApply) {
      const Pack<T, V> x = *at<T, V>(a.a, row, j);
      Pack<T, V> y;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float4 f = a.coef[a.cl ? j + k : row % a.channels];
        const float v = f.x * (to_f(x.v[k]) - f.z) + f.y;
        y.v[k] = from_f<T>(a.relu ? fmaxf(v, 0.0f) : v);
      }
      *at<T, V>(a.b, row, j) = y;
    } else if (OP == kBnBwdApply) {
      const Pack<T, V> x = *at<T, V>(a.a, row, j), y = *at<T, V>(a.b, row, j), dy = *at<T, V>(a.c, row, j);
      Pack<T, V>* dxp = at<T, V>(a.d, row, j);
      Pack<T, V> dx;
      if (a.beta != 0.0f) dx = *dxp;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float4 f = a.coef[a.cl ? j + k : row % a.channels];
        const float g = (!a.relu || to_f(y.v[k]) > 0.0f) ? to_f(dy.v[k]) : 0.0f;
        const float v = f.x * (g - f.y - (to_f(x.v[k]) - f.w) * f.z);
        dx.v[k] = from_f<T>(a.beta == 0.0f ? v : v + a.beta * to_f(dx.v[k]));
      }
      *dxp = dx;
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

}  // namespace

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

bool all_rows(const View* v, int n, bool cl, Rows* r) {
  for (int k = 0; k < n; ++k) {
    if (v[k].t != v[0].t || v[k].n != v[0].n || v[k].c != v[0].c || v[k].h != v[0].h || v[k].w != v[0].w) return false;
    if (!as_rows(v[k], cl, r[k])) return false;
  }
  return true;
}

namespace {

template <int OP, class T>
cudaError_t launch_rows_t(RowArgs a, int n_views, long long rows, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const Rows* views[4] = {&a.a, &a.b, &a.c, &a.d};
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

}  // namespace

template <int OP>
bool launch_rows(RowArgs a, const View* v, int n_views, cudaStream_t s, cudaError_t& err) {
  const bool cl = v[n_views - 1].sc == 1 && v[n_views - 1].c > 1;  // the destination's order
  Rows rs[4] = {};
  if (!all_rows(v, n_views, cl, rs)) return false;
  a.a = rs[0];
  a.b = rs[1];
  a.c = rs[2];
  a.d = rs[3];
  const long long rows = cl ? v[0].n * v[0].h * v[0].w : v[0].n * v[0].c;
  const unsigned long long total = static_cast<unsigned long long>(rows) * static_cast<unsigned long long>(a.a.len);
  if (total >= (1ULL << 31)) return false;
  a.cl = cl;
  a.channels = static_cast<unsigned>(v[0].c);
  if (v[0].t == kF32)
    err = launch_rows_t<OP, float>(a, n_views, rows, s);
  else if (v[0].t == kBF16)
    err = launch_rows_t<OP, __nv_bfloat16>(a, n_views, rows, s);
  else
    err = launch_rows_t<OP, __half>(a, n_views, rows, s);
  return true;
}

template bool launch_rows<kRelu>(RowArgs, const View*, int, cudaStream_t, cudaError_t&);
template bool launch_rows<kReluBwd>(RowArgs, const View*, int, cudaStream_t, cudaError_t&);
template bool launch_rows<kAdd>(RowArgs, const View*, int, cudaStream_t, cudaError_t&);
template bool launch_rows<kBnInfer>(RowArgs, const View*, int, cudaStream_t, cudaError_t&);
template bool launch_rows<kBnApply>(RowArgs, const View*, int, cudaStream_t, cudaError_t&);
template bool launch_rows<kBnBwdApply>(RowArgs, const View*, int, cudaStream_t, cudaError_t&);
template bool launch_rows<kAddRelu>(RowArgs, const View*, int, cudaStream_t, cudaError_t&);
template bool launch_rows<kAddReluBwd>(RowArgs, const View*, int, cudaStream_t, cudaError_t&);

}  // namespace stepbench::cuda
