// A convolution's bias and ReLU (BiasActOp) on hand-written kernels: in place on the output forward;
// backward one pass that writes the masked gradient and sums it per channel (in double, per thread,
// then added up) for the bias. Per row along w in NCHW, per pixel along the channels in NHWC; any
// strides.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "backend/cpu/common.hpp"

namespace stepbench::cpu {
namespace {

// The contiguous run of (n, c, h, w) in t: a row of w (NCHW), a pixel's channels (NHWC).
template <class T>
inline T* run_at(const Tensor& t, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return t.as<T>() + t.desc.offset(n, c, h, w);
}

template <class T>
void forward_typed(const Tensor& y, const float* b, bool relu) {
  const Shape& s = y.shape();
  const float lo = relu ? 0.0f : -std::numeric_limits<float>::infinity();
  if (y.desc.layout == Layout::nchw) {
#pragma omp parallel for collapse(2) schedule(static)
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t c = 0; c < s.c; ++c)
        for (std::int64_t h = 0; h < s.h; ++h) {
          T* p = run_at<T>(y, n, c, h, 0);
          for (std::int64_t w = 0; w < s.w; ++w) p[w] = st<T>(std::max(ld(p[w]) + b[c], lo));
        }
    return;
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t w = 0; w < s.w; ++w) {
        T* p = run_at<T>(y, n, 0, h, w);
        for (std::int64_t c = 0; c < s.c; ++c) p[c] = st<T>(std::max(ld(p[c]) + b[c], lo));
      }
}

template <class T>
void backward_typed(const Tensor& y, const Tensor& dy, const Tensor& dx, float beta, float* db, bool relu) {
  const Shape& s = y.shape();
  const bool cl = y.desc.layout == Layout::nhwc;
  const int threads = omp_get_max_threads();
  std::vector<double> part(static_cast<std::size_t>(threads * s.c), 0.0);
#pragma omp parallel num_threads(threads)
  {
    double* sum = part.data() + static_cast<std::size_t>(omp_get_thread_num() * s.c);
    // a run of len elements from (n, c, h, w), channel c + i * dc for element i
    auto run = [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t len, std::int64_t dc) {
      const T* py = run_at<const T>(y, n, c, h, w);
      const T* pg = run_at<const T>(dy, n, c, h, w);
      T* pd = run_at<T>(dx, n, c, h, w);
      for (std::int64_t i = 0; i < len; ++i) {
        const float g = !relu || ld(py[i]) > 0.0f ? ld(pg[i]) : 0.0f;
        sum[dc ? i : 0] += g;
        pd[i] = st<T>(beta == 0.0f ? g : g + beta * ld(pd[i]));
      }
    };
    if (cl) {
#pragma omp for collapse(2) schedule(static)
      for (std::int64_t n = 0; n < s.n; ++n)
        for (std::int64_t h = 0; h < s.h; ++h)
          for (std::int64_t w = 0; w < s.w; ++w) run(n, 0, h, w, s.c, 1);
    } else {
      // per channel: each thread's sums for the channels it took
#pragma omp for schedule(static)
      for (std::int64_t c = 0; c < s.c; ++c) {
        double* keep = sum;
        sum = keep + c;
        for (std::int64_t n = 0; n < s.n; ++n)
          for (std::int64_t h = 0; h < s.h; ++h) run(n, c, h, 0, s.w, 0);
        sum = keep;
      }
    }
  }
  for (std::int64_t c = 0; c < s.c; ++c) {
    double total = 0.0;
    for (int t = 0; t < threads; ++t) total += part[static_cast<std::size_t>(t * s.c + c)];
    db[c] = static_cast<float>(total);
  }
}

class CpuBiasAct final : public BiasActOp {
 public:
  explicit CpuBiasAct(bool relu) : relu_(relu) {}
  void forward(Stream&, const Tensor& y, const float* b) override {
    check_cpu_dtype(y, "bias");
    dispatch_dtype(y.desc.dtype, [&](auto t) { forward_typed<decltype(t)>(y, b, relu_); });
  }
  void backward(Stream&, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta, float* db) override {
    check_cpu_dtype(y, "bias backward");
    SB_CHECK(dy.shape() == y.shape() && dx.shape() == y.shape(), "bias backward: shapes differ");
    SB_CHECK(dy.desc.layout == y.desc.layout && dx.desc.layout == y.desc.layout, "bias backward: layouts differ");
    dispatch_dtype(y.desc.dtype, [&](auto t) { backward_typed<decltype(t)>(y, dy, dx, beta, db, relu_); });
  }

 private:
  bool relu_;
};

}  // namespace

std::unique_ptr<BiasActOp> make_bias_act(const TensorDesc& y, bool relu) {
  if (y.dtype != DType::f32 && y.dtype != DType::bf16)
    throw UnsupportedError("bias: the cpu backend computes in fp32 or bf16");
  return std::make_unique<CpuBiasAct>(relu);
}

}  // namespace stepbench::cpu
