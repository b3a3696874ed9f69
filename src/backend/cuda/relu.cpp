// The standalone ReLU on stepbench's kernels (kernels_elementwise.cu); batch norm fuses its own.
#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

class CudaRelu final : public ReluOp {
 public:
  explicit CudaRelu(const Ctx& c) : c_(c) {}
  void forward(Stream& s, const Tensor& x, const Tensor& y) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_relu_forward(view(x), view(y), S(s)));
  }
  void backward(Stream& s, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_relu_backward(view(y), view(dy), view(dx), beta, S(s)));
  }

 private:
  Ctx c_;
};

}  // namespace

std::unique_ptr<ReluOp> make_cuda_relu(const Ctx& c) { return std::make_unique<CudaRelu>(c); }

}  // namespace stepbench::cuda
