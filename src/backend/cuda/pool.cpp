// Pooling (max, average with or without padding) on cuDNN, falling back to stepbench's kernels
// (kernels_pool.cu) where cuDNN declines or has no fast kernel.
#include <string>

#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

PoolingDescriptor pooling_descriptor(const PoolParams& p) {
  cudnnPoolingDescriptor_t h = nullptr;
  SB_CUDNN(cudnnCreatePoolingDescriptor(&h));
  PoolingDescriptor d(h);
  // max: the deterministic variant (the gradient goes to one maximum, the same every run)
  const cudnnPoolingMode_t m = p.kind == PoolKind::max               ? CUDNN_POOLING_MAX_DETERMINISTIC
                               : p.kind == PoolKind::avg_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                                     : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  SB_CUDNN(cudnnSetPooling2dDescriptor(d.get(), m, CUDNN_PROPAGATE_NAN, p.kh, p.kw, p.pad_h, p.pad_w, p.stride_h,
                                       p.stride_w));
  return d;
}

// Pooling on cuDNN, strided descriptors on both sides (a max pool branch writes its concat slice),
// except NHWC average pooling.
// cuDNN's max pool backward finds the maximum again from x and y, so nothing is reserved; where
// cuDNN declines, our kernel does the same (argmax null).
class CudaPool final : public PoolOp {
 public:
  CudaPool(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const PoolParams& p)
      : c_(c),
        x_(x),
        y_(y),
        xd_(tensor_descriptor(x)),
        yd_(tensor_descriptor(y)),
        pd_(pooling_descriptor(p)),
        // NHWC average pooling: cuDNN has no channels-last kernel for it (a generic one ran 20x
        // slower than its max pool on an H100); ours walks channels-last memory in order.
        own_(c.own_norm_pool || (x.layout == Layout::nhwc && p.kind != PoolKind::max)) {
    SB_CHECK(pool_output_shape(x.shape, p) == y.shape, "pool output shape mismatch");
    a_ = cuda::PoolArgs{p.kh,
                        p.kw,
                        p.stride_h,
                        p.stride_w,
                        p.pad_h,
                        p.pad_w,
                        p.kind == PoolKind::max               ? 0
                        : p.kind == PoolKind::avg_include_pad ? 1
                                                              : 2};
  }
  std::size_t reserve_bytes() const override { return 0; }
  std::string implementation() const override { return own_ ? "stepbench kernel" : "cudnn"; }
  void forward(Stream& s, const Tensor& x, const Tensor& y, void*) override {
    set(s);
    const float one = 1, zero = 0;
    if (!own_ && x.desc == x_ && y.desc == y_) {
      const cudnnStatus_t st =
          SB_CUDNN_TRY(cudnnPoolingForward(c_.cudnn, pd_.get(), &one, xd_.get(), x.data, &zero, yd_.get(), y.data));
      if (st == CUDNN_STATUS_SUCCESS) return;
      own_ = true;
      c_.notes->note("pooling", "forward", x_, st, "stepbench's kernel");
    }
    SB_CUDA(cuda::launch_pool_forward(view(x), view(y), a_, nullptr, S(s)));
  }
  void backward(Stream& s, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta,
                const void*) override {
    set(s);
    const float one = 1;
    if (!own_ && x.desc == x_ && y.desc == y_ && dy.desc == y_ && dx.desc == x_) {
      const cudnnStatus_t st =
          SB_CUDNN_TRY(cudnnPoolingBackward(c_.cudnn, pd_.get(), &one, yd_.get(), y.data, yd_.get(), dy.data, xd_.get(),
                                            x.data, &beta, xd_.get(), dx.data));
      if (st == CUDNN_STATUS_SUCCESS) return;
      own_ = true;
      c_.notes->note("pooling", "backward", x_, st, "stepbench's kernel");
    }
    SB_CUDA(cuda::launch_pool_backward(view(x), view(dy), view(dx), a_, beta, nullptr, S(s)));
  }

 private:
  void set(Stream& s) {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDNN(cudnnSetStream(c_.cudnn, S(s)));
  }
  Ctx c_;
  TensorDesc x_, y_;
  TensorDescriptor xd_, yd_;
  PoolingDescriptor pd_;
  cuda::PoolArgs a_{};
  bool own_;
};

}  // namespace

std::unique_ptr<PoolOp> make_cuda_pool(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const PoolParams& p) {
  return std::make_unique<CudaPool>(c, x, y, p);
}

}  // namespace stepbench::cuda
