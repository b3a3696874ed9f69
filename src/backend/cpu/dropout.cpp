// Dropout on hand-written kernels: a counter-based mask (splitmix64 of seed, step and element
// index), kept as one byte per element for backward.
#include <cstdint>
#include <memory>

#include "backend/cpu/common.hpp"

namespace stepbench::cpu {
namespace {

inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void dropout_forward(const Tensor& x, const Tensor& y, std::uint8_t* mask, double p, std::uint64_t seed,
                     std::uint64_t step) {
  check_cpu_dtype(x, "dropout");
  SB_CHECK(x.desc.is_dense() && y.desc.is_dense(), "dropout takes dense tensors");
  const auto n = x.desc.numel();
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p));
  const std::uint64_t key = splitmix64(seed ^ splitmix64(step));
  // keep when the element's 24-bit uniform is >= p
  const auto threshold = static_cast<std::uint32_t>(p * 16777216.0);
  dispatch_dtype(x.desc.dtype, [&](auto t) {
    using T = decltype(t);
    const T* X = x.as<T>();
    T* Y = y.as<T>();
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<std::uint32_t>(splitmix64(key + static_cast<std::uint64_t>(i)) >> 40);
      const std::uint8_t keep = u >= threshold;
      mask[i] = keep;
      Y[i] = st<T>(keep ? ld(X[i]) * keep_scale : 0.0f);
    }
  });
}

void dropout_backward(const Tensor& dy, const Tensor& dx, float beta, const std::uint8_t* mask, double p) {
  SB_CHECK(dy.desc.is_dense() && dx.desc.is_dense(), "dropout takes dense tensors");
  const auto n = dy.desc.numel();
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p));
  dispatch_dtype(dy.desc.dtype, [&](auto t) {
    using T = decltype(t);
    const T* DY = dy.as<T>();
    T* DX = dx.as<T>();
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = mask[i] ? ld(DY[i]) * keep_scale : 0.0f;
      DX[i] = st<T>(beta == 0.0f ? v : v + beta * ld(DX[i]));
    }
  });
}

class CpuDropout final : public DropoutOp {
 public:
  CpuDropout(const TensorDesc& x, double p) : n_(static_cast<std::size_t>(x.numel())), p_(p) {
    if (!(p >= 0.0 && p < 1.0)) throw UsageError(fmt::format("dropout probability {} must be in [0, 1)", p));
  }
  std::size_t reserve_bytes() const override { return n_; }
  void forward(Stream&, const Tensor& x, const Tensor& y, void* reserve, std::uint64_t seed,
               std::uint64_t step) override {
    dropout_forward(x, y, static_cast<std::uint8_t*>(reserve), p_, seed, step);
  }
  void backward(Stream&, const Tensor& dy, const Tensor& dx, float beta, const void* reserve) override {
    dropout_backward(dy, dx, beta, static_cast<const std::uint8_t*>(reserve), p_);
  }

 private:
  std::size_t n_;
  double p_;
};

}  // namespace

std::unique_ptr<DropoutOp> make_dropout(const TensorDesc& x, double p) { return std::make_unique<CpuDropout>(x, p); }

}  // namespace stepbench::cpu
