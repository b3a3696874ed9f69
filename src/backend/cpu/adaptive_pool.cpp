// Adaptive average pooling (AdaptiveAvgPoolOp) on hand-written kernels, PyTorch's windows: forward
// averages each output's window; backward gathers, per input element, dy / size of every window that
// covers it (windows overlap where the output is larger than the input), so no two threads write one
// element. Parallel over images and channels; any strides and layout.
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/common.hpp"

namespace stepbench::cpu {
namespace {

// Output o's window over an input of `in`: [floor(o in / out), ceil((o + 1) in / out)).
struct Span {
  std::int64_t lo, hi;
};
std::vector<Span> spans(std::int64_t in, std::int64_t out) {
  std::vector<Span> r(static_cast<std::size_t>(out));
  for (std::int64_t o = 0; o < out; ++o) r[o] = {o * in / out, ((o + 1) * in + out - 1) / out};
  return r;
}

class CpuAdaptiveAvgPool final : public AdaptiveAvgPoolOp {
 public:
  CpuAdaptiveAvgPool(const TensorDesc& x, const TensorDesc& y)
      : xs_(x.shape), ys_(y.shape), rows_(spans(x.shape.h, y.shape.h)), cols_(spans(x.shape.w, y.shape.w)) {}
  void forward(Stream&, const Tensor& x, const Tensor& y) override {
    check_cpu_dtype(x, "adaptive average pooling");
    SB_CHECK(x.shape() == xs_ && y.shape() == ys_, "adaptive average pooling: shapes differ from the planned");
    dispatch_dtype(x.desc.dtype, [&](auto t) {
      using T = decltype(t);
#pragma omp parallel for collapse(2) schedule(static)
      for (std::int64_t n = 0; n < ys_.n; ++n)
        for (std::int64_t c = 0; c < ys_.c; ++c)
          for (std::int64_t oh = 0; oh < ys_.h; ++oh)
            for (std::int64_t ow = 0; ow < ys_.w; ++ow) {
              const Span r = rows_[oh], q = cols_[ow];
              float sum = 0.0f;
              for (std::int64_t h = r.lo; h < r.hi; ++h)
                for (std::int64_t w = q.lo; w < q.hi; ++w) sum += ld(x.as<T>()[x.desc.offset(n, c, h, w)]);
              y.as<T>()[y.desc.offset(n, c, oh, ow)] = st<T>(sum / static_cast<float>((r.hi - r.lo) * (q.hi - q.lo)));
            }
    });
  }
  void backward(Stream&, const Tensor& dy, const Tensor& dx, float beta) override {
    check_cpu_dtype(dy, "adaptive average pooling backward");
    SB_CHECK(dx.shape() == xs_ && dy.shape() == ys_, "adaptive average pooling backward: shapes differ");
    dispatch_dtype(dy.desc.dtype, [&](auto t) {
      using T = decltype(t);
#pragma omp parallel for collapse(2) schedule(static)
      for (std::int64_t n = 0; n < xs_.n; ++n)
        for (std::int64_t c = 0; c < xs_.c; ++c)
          for (std::int64_t h = 0; h < xs_.h; ++h)
            for (std::int64_t w = 0; w < xs_.w; ++w) {
              float g = 0.0f;
              for (std::int64_t oh = 0; oh < ys_.h; ++oh) {
                if (h < rows_[oh].lo || h >= rows_[oh].hi) continue;
                for (std::int64_t ow = 0; ow < ys_.w; ++ow) {
                  const Span r = rows_[oh], q = cols_[ow];
                  if (w < q.lo || w >= q.hi) continue;
                  g += ld(dy.as<T>()[dy.desc.offset(n, c, oh, ow)]) / static_cast<float>((r.hi - r.lo) * (q.hi - q.lo));
                }
              }
              T& o = dx.as<T>()[dx.desc.offset(n, c, h, w)];
              o = st<T>(beta == 0.0f ? g : g + beta * ld(o));
            }
    });
  }

 private:
  Shape xs_, ys_;
  std::vector<Span> rows_, cols_;
};

}  // namespace

std::unique_ptr<AdaptiveAvgPoolOp> make_adaptive_avg_pool(const TensorDesc& x, const TensorDesc& y) {
  if (x.dtype != DType::f32 && x.dtype != DType::bf16)
    throw UnsupportedError("adaptive average pooling: the cpu backend computes in fp32 or bf16");
  SB_CHECK(x.shape.n == y.shape.n && x.shape.c == y.shape.c && y.shape.h > 0 && y.shape.w > 0,
           "adaptive average pooling: the output keeps the images and channels");
  return std::make_unique<CpuAdaptiveAvgPool>(x, y);
}

}  // namespace stepbench::cpu
