// Adaptive average pooling on stepbench's kernels (kernels_bias_act.cu): PyTorch's windows; backward
// gathers per input element from the windows that cover it. cuDNN has no adaptive pooling.
#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

class CudaAdaptiveAvgPool final : public AdaptiveAvgPoolOp {
 public:
  explicit CudaAdaptiveAvgPool(const Ctx& c) : c_(c) {}
  void forward(Stream& s, const Tensor& x, const Tensor& y) override {
    SB_CHECK(x.shape().n == y.shape().n && x.shape().c == y.shape().c,
             "adaptive average pooling: the output keeps the images and channels");
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_adaptive_avg_pool_forward(view(x), view(y), S(s)));
  }
  void backward(Stream& s, const Tensor& dy, const Tensor& dx, float beta) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_adaptive_avg_pool_backward(view(dy), view(dx), beta, S(s)));
  }

 private:
  Ctx c_;
};

}  // namespace

std::unique_ptr<AdaptiveAvgPoolOp> make_cuda_adaptive_avg_pool(const Ctx& c) {
  return std::make_unique<CudaAdaptiveAvgPool>(c);
}

}  // namespace stepbench::cuda
