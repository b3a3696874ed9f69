// Softmax cross-entropy on hand-written kernels: forward keeps the probabilities for backward and
// writes the batch-mean loss; backward scales by the loss weight (times the loss scale, if any).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>

#include "backend/cpu/common.hpp"

namespace stepbench::cpu {
namespace {

void softmax_xent_forward(const Tensor& logits, const std::int32_t* labels, float* loss, float* probs) {
  check_cpu_dtype(logits, "softmax cross-entropy");
  SB_CHECK(logits.desc.is_dense() && logits.shape().h == 1 && logits.shape().w == 1,
           "softmax cross-entropy takes dense N x M logits");
  const std::int64_t N = logits.shape().n, M = logits.shape().c;
  for (std::int64_t i = 0; i < N; ++i)
    if (labels[i] < 0 || labels[i] >= M)
      throw UsageError(
          fmt::format("label {} of sample {} is outside [0, {}): the labels do not fit the model's "
                      "number of classes",
                      labels[i], i, M));
  // in fp32 whatever the logits' type (bf16 logits are widened: autocast's cross-entropy is fp32)
  double total = 0;
  dispatch_dtype(logits.desc.dtype, [&](auto t) {
    using T = decltype(t);
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (std::int64_t i = 0; i < N; ++i) {
      const T* z = logits.as<T>() + i * M;
      float* pr = probs + i * M;
      float mx = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < M; ++j) mx = std::max(mx, ld(z[j]));
      double sum = 0;
      for (std::int64_t j = 0; j < M; ++j) {
        pr[j] = std::exp(ld(z[j]) - mx);
        sum += pr[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (std::int64_t j = 0; j < M; ++j) pr[j] *= inv;
      total += std::log(sum) + mx - ld(z[labels[i]]);
    }
  });
  *loss = static_cast<float>(total / static_cast<double>(N));
}

void softmax_xent_backward(const std::int32_t* labels, const Tensor& dlogits, float scale, float beta,
                           const float* probs) {
  const std::int64_t N = dlogits.shape().n, M = dlogits.shape().c;
  const float k = scale / static_cast<float>(N);
  dispatch_dtype(dlogits.desc.dtype, [&](auto t) {
    using T = decltype(t);
    T* D = dlogits.as<T>();
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t j = 0; j < M; ++j) {
        const float v = k * (probs[i * M + j] - (j == labels[i] ? 1.0f : 0.0f));
        D[i * M + j] = st<T>(beta == 0.0f ? v : v + beta * ld(D[i * M + j]));
      }
  });
}

class CpuSoftmaxXent final : public SoftmaxCrossEntropyOp {
 public:
  explicit CpuSoftmaxXent(const TensorDesc& l) : n_(static_cast<std::size_t>(l.numel())) {}
  std::size_t reserve_bytes() const override { return n_ * sizeof(float); }
  void forward(Stream&, const Tensor& logits, const std::int32_t* labels, float* loss, void* reserve) override {
    softmax_xent_forward(logits, labels, loss, static_cast<float*>(reserve));
  }
  void backward(Stream&, const std::int32_t* labels, const Tensor& dlogits, float scale, float beta,
                const void* reserve, const float* loss_scale) override {
    softmax_xent_backward(labels, dlogits, loss_scale ? scale * *loss_scale : scale, beta,
                          static_cast<const float*>(reserve));
  }

 private:
  std::size_t n_;
};

}  // namespace

std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const TensorDesc& logits) {
  return std::make_unique<CpuSoftmaxXent>(logits);
}

}  // namespace stepbench::cpu
