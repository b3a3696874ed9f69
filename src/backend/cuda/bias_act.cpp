// A convolution's bias and ReLU on stepbench's kernels (kernels_bias_act.cu): in place forward; one
// backward pass writing the masked gradient, with a block per channel summing the bias gradient.
#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

class CudaBiasAct final : public BiasActOp {
 public:
  CudaBiasAct(const Ctx& c, bool relu) : c_(c), relu_(relu) {}
  void forward(Stream& s, const Tensor& y, const float* b) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_bias_act_forward(view(y), b, relu_, S(s)));
  }
  void backward(Stream& s, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta, float* db) override {
    SB_CHECK(dy.shape() == y.shape() && dx.shape() == y.shape(), "bias backward: shapes differ");
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_bias_act_backward(view(y), view(dy), view(dx), beta, db, relu_, S(s)));
  }

 private:
  Ctx c_;
  bool relu_;
};

}  // namespace

std::unique_ptr<BiasActOp> make_cuda_bias_act(const Ctx& c, bool relu) {
  return std::make_unique<CudaBiasAct>(c, relu);
}

}  // namespace stepbench::cuda
