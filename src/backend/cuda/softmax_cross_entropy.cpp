// Softmax cross-entropy on stepbench's kernels (kernels_loss.cu): the probabilities and per-sample
// losses go to the reserve for the backward.
#include <fmt/format.h>

#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

// Labels outside [0, M) cannot be checked on the host before the kernel without a synchronisation:
// the kernel flags them, the flag is copied to pinned memory in stream order (a node of a captured
// graph too), and check_labels() reads it after the caller has synchronised the stream.
class CudaSoftmaxXent final : public SoftmaxCrossEntropyOp {
 public:
  CudaSoftmaxXent(const Ctx& c, const TensorDesc& l) : c_(c), N_(l.shape.n), M_(l.shape.c) {
    SB_CHECK(l.is_dense() && l.shape.h == 1 && l.shape.w == 1, "softmax cross-entropy takes dense N x M logits");
    SB_CUDA(cudaSetDevice(c_.device));
    void* p = nullptr;
    SB_CUDA(cudaMallocHost(&p, sizeof(int)));
    host_buf_ = PinnedBuffer(p);
    host_flag_ = static_cast<int*>(p);
    *host_flag_ = 0;
  }
  // probabilities, per-sample losses, the bad-label flag
  std::size_t reserve_bytes() const override {
    return static_cast<std::size_t>(N_ * M_ + N_) * sizeof(float) + sizeof(int);
  }
  void forward(Stream& s, const Tensor& logits, const std::int32_t* labels, float* loss, void* reserve) override {
    SB_CUDA(cudaSetDevice(c_.device));
    float* probs = static_cast<float*>(reserve);
    float* rows = probs + N_ * M_;
    int* flag = reinterpret_cast<int*>(rows + N_);
    SB_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), S(s)));
    SB_CUDA(cuda::launch_softmax_xent_forward(flat(logits.data, logits.desc.dtype), labels, loss, probs, rows, flag, N_,
                                              M_, S(s)));
    SB_CUDA(cudaMemcpyAsync(host_flag_, flag, sizeof(int), cudaMemcpyDeviceToHost, S(s)));
  }
  void backward(Stream& s, const std::int32_t* labels, const Tensor& dlogits, float scale, float beta,
                const void* reserve, const float* loss_scale) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_softmax_xent_backward(labels, flat(dlogits.data, dlogits.desc.dtype),
                                               static_cast<const float*>(reserve), scale, beta, loss_scale, N_, M_,
                                               S(s)));
  }

  void check_labels() override {
    if (*host_flag_ != 0) {
      const int sample = *host_flag_ - 1;
      *host_flag_ = 0;
      throw UsageError(
          fmt::format("the label of sample {} is outside [0, {}): the labels do not fit the model's "
                      "number of classes",
                      sample, M_));
    }
  }

 private:
  Ctx c_;
  long long N_, M_;
  PinnedBuffer host_buf_;
  int* host_flag_ = nullptr;  // in host_buf_
};

}  // namespace

std::unique_ptr<SoftmaxCrossEntropyOp> make_cuda_softmax_cross_entropy(const Ctx& c, const TensorDesc& logits) {
  return std::make_unique<CudaSoftmaxXent>(c, logits);
}

}  // namespace stepbench::cuda
