// The residual add + ReLU on stepbench's kernels (kernels_elementwise.cu; row kernels where the
// views are rows of one order): one pass forward, one backward writing both inputs' gradients.
#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

class CudaAddRelu final : public AddReluOp {
 public:
  explicit CudaAddRelu(const Ctx& c) : c_(c) {}
  void forward(Stream& s, const Tensor& a, const Tensor& b, const Tensor& y) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_add_relu_forward(view(a), view(b), view(y), S(s)));
  }
  void backward(Stream& s, const Tensor& y, const Tensor& dy, const Tensor& da, float beta_a, const Tensor& db,
                float beta_b) override {
    SB_CUDA(cudaSetDevice(c_.device));
    if (da.data && db.data)
      SB_CUDA(cuda::launch_add_relu_backward(view(y), view(dy), view(da), beta_a, view(db), beta_b, S(s)));
    else if (da.data || db.data)  // one input takes a gradient: the ReLU's backward into it
      SB_CUDA(cuda::launch_relu_backward(view(y), view(dy), view(da.data ? da : db), da.data ? beta_a : beta_b, S(s)));
  }

 private:
  Ctx c_;
};

}  // namespace

std::unique_ptr<AddReluOp> make_cuda_add_relu(const Ctx& c) { return std::make_unique<CudaAddRelu>(c); }

}  // namespace stepbench::cuda
