// The standalone ReLU on stepbench's kernels (kernels_elementwise.cu; the clipped one, ReLU6, in
// kernels_bias_act.cu); batch norm fuses its own.
#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

class CudaRelu final : public ReluOp {
 public:
  CudaRelu(const Ctx& c, float clip) : c_(c), clip_(clip) {}
  void forward(Stream& s, const Tensor& x, const Tensor& y) override {
    SB_CUDA(cudaSetDevice(c_.device));
    if (clip_ == kNoClip)
      SB_CUDA(cuda::launch_relu_forward(view(x), view(y), S(s)));
    else
      SB_CUDA(cuda::launch_relu_clip_forward(view(x), view(y), clip_, S(s)));
  }
  void backward(Stream& s, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta) override {
    SB_CUDA(cudaSetDevice(c_.device));
    if (clip_ == kNoClip)
      SB_CUDA(cuda::launch_relu_backward(view(y), view(dy), view(dx), beta, S(s)));
    else
      SB_CUDA(cuda::launch_relu_clip_backward(view(y), view(dy), view(dx), beta, clip_, S(s)));
  }

 private:
  Ctx c_;
  float clip_;
};

}  // namespace

std::unique_ptr<ReluOp> make_cuda_relu(const Ctx& c, float clip) { return std::make_unique<CudaRelu>(c, clip); }

}  // namespace stepbench::cuda
