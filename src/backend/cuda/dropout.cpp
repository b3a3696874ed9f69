// Dropout on stepbench's kernels (kernels_dropout.cu); the mask, one byte per element, is the reserve.
#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

class CudaDropout final : public DropoutOp {
 public:
  CudaDropout(const Ctx& c, const TensorDesc& x, double p) : c_(c), n_(x.numel()), p_(p) {
    if (!(p >= 0.0 && p < 1.0)) throw UsageError(fmt::format("dropout probability {} must be in [0, 1)", p));
    SB_CHECK(x.is_dense(), "dropout takes dense tensors");
  }
  std::size_t reserve_bytes() const override { return static_cast<std::size_t>(n_); }
  void forward(Stream& s, const Tensor& x, const Tensor& y, void* reserve, std::uint64_t seed,
               std::uint64_t step) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_dropout_forward(flat(x.data, x.desc.dtype), flat(y.data, y.desc.dtype),
                                         static_cast<std::uint8_t*>(reserve), n_, p_, seed, step, S(s)));
  }
  void backward(Stream& s, const Tensor& dy, const Tensor& dx, float beta, const void* reserve) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_dropout_backward(flat(dy.data, dy.desc.dtype), flat(dx.data, dx.desc.dtype),
                                          static_cast<const std::uint8_t*>(reserve), n_, p_, beta, S(s)));
  }

 private:
  Ctx c_;
  long long n_;
  double p_;
};

}  // namespace

std::unique_ptr<DropoutOp> make_cuda_dropout(const Ctx& c, const TensorDesc& x, double p) {
  return std::make_unique<CudaDropout>(c, x, p);
}

}  // namespace stepbench::cuda
