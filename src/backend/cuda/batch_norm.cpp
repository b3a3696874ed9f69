// Batch norm on cuDNN (ReLU fused where cuDNN can), falling back to stepbench's kernels
// (kernels_batch_norm.cu) where cuDNN declines a configuration; inference always on ours.
#include <algorithm>
#include <string>

#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

ActivationDescriptor relu_descriptor() {
  cudnnActivationDescriptor_t h = nullptr;
  SB_CUDNN(cudnnCreateActivationDescriptor(&h));
  ActivationDescriptor d(h);
  SB_CUDNN(cudnnSetActivationDescriptor(d.get(), CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  return d;
}
// The 1 x C x 1 x 1 fp32 descriptor of BN's scale, bias, mean and variance (fp32 whatever x is).
TensorDescriptor bn_param_descriptor(cudnnTensorDescriptor_t x) {
  cudnnTensorDescriptor_t h = nullptr;
  SB_CUDNN(cudnnCreateTensorDescriptor(&h));
  TensorDescriptor d(h);
  SB_CUDNN(cudnnDeriveBNTensorDescriptor(d.get(), x, CUDNN_BATCHNORM_SPATIAL));
  return d;
}

// Batch norm on cuDNN: spatial mode, the persistent kernels for NHWC training (as PyTorch picks
// them), with the ReLU fused by cudnnBatchNormalization*Ex where cuDNN offers it (NHWC, output and
// its gradient dense). Elsewhere the ReLU is a pass of our own: in place on y after the forward,
// and in backward the masked gradient goes to the workspace (dense, x's layout), which cuDNN then
// reads; the incoming gradient is never written. x (the conv output) is always dense; y and dy may
// be concat slices, which cuDNN reads and writes through strided descriptors.
class CudaBatchNorm final : public BatchNormOp {
 public:
  CudaBatchNorm(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const BatchNormParams& p)
      : c_(c),
        p_(p),
        x_(x),
        y_(y),
        xd_(tensor_descriptor(x)),
        yd_(tensor_descriptor(y)),
        bnd_(bn_param_descriptor(xd_.get())),
        act_(relu_descriptor()) {
    SB_CHECK(x.shape == y.shape && x.dtype == y.dtype, "batch norm: x and y differ in shape or type");
    own_ = c.own_norm_pool || !x.is_dense();
    if (x.layout == Layout::nhwc) mode_ = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
    // NHWC: the Ex API, with the ReLU fused where cuDNN offers it (y dense), else with BN alone on
    // dense buffers (y a concat slice, no ReLU, or the fused call declined at run time); the non-Ex
    // calls take cuDNN's slow generic kernels for NHWC (measured on an H100: 44 such layers of
    // Inception-v3 took about half of a bf16 training step). The workspace and reserve fit both, so
    // a fused call declined in a step falls back to BN alone without allocating.
    if (!own_ && x.layout == Layout::nhwc) {
      std::size_t f = 0, b = 0, r = 0;
      bn_ok_ = ex_sizes(CUDNN_BATCHNORM_OPS_BN, nullptr, f, b, r);
      if (bn_ok_) {
        ex_ws_ = std::max(f, b);
        reserve_ = r;
      }
      if (p.relu && y.is_dense() && ex_sizes(CUDNN_BATCHNORM_OPS_BN_ACTIVATION, act_.get(), f, b, r)) {
        fused_ = true;
        ex_ws_ = std::max({ex_ws_, f, b});
        reserve_ = std::max(reserve_, r);
      }
      ex_bn_ = !fused_ && bn_ok_;
    }
    // [masked gradient or dense y, x.bytes() | cuDNN's own workspace for the Ex calls]; our kernels'
    // partial sums (from the start) where they run, from the beginning or after a decline
    if (!own_) temp_ = (x.bytes() + 255) / 256 * 256;
    scratch_ = bn_scratch_bytes(x.shape.n, x.shape.c, x.shape.h, x.shape.w);
  }
  std::size_t workspace_bytes() const override { return std::max(temp_ + ex_ws_, scratch_); }
  // forward_recompute's C float4 (our kernel's, in scratch_); forward_inference takes none
  std::size_t recompute_workspace_bytes() const override { return scratch_; }
  std::size_t reserve_bytes() const override { return reserve_; }
  std::string implementation() const override {
    if (own_) return "stepbench kernel";
    return fmt::format("cudnn {}{}{} (inference: stepbench kernel)",
                       mode_ == CUDNN_BATCHNORM_SPATIAL_PERSISTENT ? "spatial persistent" : "spatial",
                       fused_   ? ", relu fused"
                       : ex_bn_ ? " (Ex), dense copy"
                                : "",
                       p_.relu && !fused_ ? ", relu pass" : "");
  }

  void forward_training(Stream& s, const Tensor& x, const Tensor& y, const float* gamma, const float* beta, float* rm,
                        float* rv, float* sm, float* si, void* ws, void* reserve) override {
    set(s);
    const float one = 1, zero = 0;
    if (!own_ && x.desc == x_ && y.desc == y_) {
      if (fused_) {
        const cudnnStatus_t st = SB_CUDNN_TRY(cudnnBatchNormalizationForwardTrainingEx(
            c_.cudnn, mode_, CUDNN_BATCHNORM_OPS_BN_ACTIVATION, &one, &zero, xd_.get(), x.data, nullptr, nullptr,
            yd_.get(), y.data, bnd_.get(), gamma, beta, p_.momentum, rm, rv, p_.eps, sm, si, act_.get(), ex_ws(ws),
            ex_ws_, reserve, reserve_));
        if (st == CUDNN_STATUS_SUCCESS) return;
        drop_fused("forward", st);
      }
      if (ex_bn_) {
        // BN into a dense y in the workspace, then the ReLU (or a copy) into y, which may be a slice
        const Tensor t{ws, x_};
        const cudnnStatus_t st = SB_CUDNN_TRY(cudnnBatchNormalizationForwardTrainingEx(
            c_.cudnn, mode_, CUDNN_BATCHNORM_OPS_BN, &one, &zero, xd_.get(), x.data, nullptr, nullptr, xd_.get(),
            t.data, bnd_.get(), gamma, beta, p_.momentum, rm, rv, p_.eps, sm, si, nullptr, ex_ws(ws), ex_ws_, reserve,
            reserve_));
        if (st == CUDNN_STATUS_SUCCESS) {
          if (p_.relu)
            SB_CUDA(cuda::launch_relu_forward(view(t), view(y), S(s)));
          else
            SB_CUDA(cuda::launch_add(view(t), view(y), 0.0f, S(s)));
          return;
        }
        ex_bn_ = false;
        c_.notes->note("batch norm", "forward (Ex API, OPS_BN)", x_, st, "the non-Ex API");
      }
      while (!own_) {
        const cudnnStatus_t st = SB_CUDNN_TRY(
            cudnnBatchNormalizationForwardTraining(c_.cudnn, mode_, &one, &zero, xd_.get(), x.data, yd_.get(), y.data,
                                                   bnd_.get(), gamma, beta, p_.momentum, rm, rv, p_.eps, sm, si));
        if (st == CUDNN_STATUS_SUCCESS) {
          if (p_.relu) SB_CUDA(cuda::launch_relu_forward(view(y), view(y), S(s)));
          return;
        }
        decline("forward", st);
      }
    }
    SB_CUDA(cuda::launch_bn_forward_training(view(x), view(y), gamma, beta, rm, rv, sm, si, p_.eps, p_.momentum,
                                             p_.relu, ws, S(s)));
  }
  // Inference is one elementwise pass per channel's affine map (and the ReLU): our kernel, in the
  // tensor's memory order and fused with the ReLU, in one read and one write (cuDNN's would be a
  // second pass for the ReLU, and its NCHW-order kernel for strided NHWC slices is slow).
  void forward_inference(Stream& s, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                         const float* rm, const float* rv, void*) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_bn_forward_inference(view(x), view(y), gamma, beta, rm, rv, p_.eps, p_.relu, S(s)));
  }
  // Our kernel, whichever ran the training forward: cuDNN has no call that applies saved statistics
  // (its inference call takes a variance, and a ReLU only as a second pass). The factors go to the
  // workspace, which holds C float4 (scratch_).
  void forward_recompute(Stream& s, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                         const float* sm, const float* si, void* ws, const void*) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_bn_forward_recompute(view(x), view(y), gamma, beta, sm, si, p_.relu, ws, S(s)));
  }
  void backward(Stream& s, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* gamma,
                const float* beta, const float* sm, const float* si, float* dgamma, float* dbeta, float beta_dx,
                void* ws, const void* reserve) override {
    set(s);
    const float one = 1, zero = 0;
    if (!own_ && x.desc == x_ && y.desc == y_ && dx.desc == x_) {
      // a fused call declined here, after a fused forward: its reserve is not what the Ex API with BN
      // alone reads, so this one backward takes the non-Ex call (saved statistics only)
      bool skip_ex = false;
      if (fused_ && dy.desc == y_) {
        const cudnnStatus_t st = SB_CUDNN_TRY(cudnnBatchNormalizationBackwardEx(
            c_.cudnn, mode_, CUDNN_BATCHNORM_OPS_BN_ACTIVATION, &one, &beta_dx, &one, &zero, xd_.get(), x.data,
            yd_.get(), y.data, yd_.get(), dy.data, nullptr, nullptr, xd_.get(), dx.data, bnd_.get(), gamma, beta,
            dgamma, dbeta, p_.eps, sm, si, act_.get(), ex_ws(ws), ex_ws_, const_cast<void*>(reserve), reserve_));
        if (st == CUDNN_STATUS_SUCCESS) return;
        drop_fused("backward", st);
        skip_ex = true;
      }
      // the gradient cuDNN reads: dy masked by the ReLU (y > 0); without the ReLU dy itself where it
      // is dense (ResNet's conv3 and downsample units), else dy copied dense
      Tensor g{ws, x_};
      if (p_.relu)
        SB_CUDA(cuda::launch_relu_backward(view(y), view(dy), view(g), 0.0f, S(s)));
      else if (dy.desc == x_)
        g = dy;
      else
        SB_CUDA(cuda::launch_add(view(dy), view(g), 0.0f, S(s)));
      if (ex_bn_ && !skip_ex) {
        const cudnnStatus_t st = SB_CUDNN_TRY(cudnnBatchNormalizationBackwardEx(
            c_.cudnn, mode_, CUDNN_BATCHNORM_OPS_BN, &one, &beta_dx, &one, &zero, xd_.get(), x.data, nullptr, nullptr,
            xd_.get(), g.data, nullptr, nullptr, xd_.get(), dx.data, bnd_.get(), gamma, beta, dgamma, dbeta, p_.eps, sm,
            si, nullptr, ex_ws(ws), ex_ws_, const_cast<void*>(reserve), reserve_));
        if (st == CUDNN_STATUS_SUCCESS) return;
        ex_bn_ = false;
        c_.notes->note("batch norm", "backward (Ex API, OPS_BN)", x_, st, "the non-Ex API");
      }
      while (!own_) {
        const cudnnStatus_t st = SB_CUDNN_TRY(cudnnBatchNormalizationBackward(
            c_.cudnn, mode_, &one, &beta_dx, &one, &zero, xd_.get(), x.data, xd_.get(), g.data, xd_.get(), dx.data,
            bnd_.get(), gamma, dgamma, dbeta, p_.eps, sm, si));
        if (st == CUDNN_STATUS_SUCCESS) return;
        decline("backward", st);
      }
    }
    SB_CUDA(cuda::launch_bn_backward(view(x), view(y), view(dy), view(dx), gamma, sm, si, dgamma, dbeta, beta_dx,
                                     p_.relu, ws, S(s)));
  }

 private:
  // persistent -> spatial -> our kernel, each step said once per kind
  void decline(const char* step, cudnnStatus_t st) {
    if (mode_ == CUDNN_BATCHNORM_SPATIAL_PERSISTENT) {
      mode_ = CUDNN_BATCHNORM_SPATIAL;
      fused_ = ex_bn_ = bn_ok_ = false;  // the Ex calls' workspace and reserve were sized for persistent
      c_.notes->note("batch norm", fmt::format("{} (spatial persistent)", step).c_str(), x_, st,
                     "cuDNN's spatial (not persistent) kernels");
      return;
    }
    own_ = true;
    c_.notes->note("batch norm", step, x_, st, "stepbench's kernel");
  }
  // The fused BN + ReLU declined: the Ex API with BN alone (and our ReLU pass), as where y is a slice
  // (the workspace and reserve were sized for it too).
  void drop_fused(const char* step, cudnnStatus_t st) {
    fused_ = false;
    ex_bn_ = bn_ok_;
    c_.notes->note(
        "batch norm", fmt::format("{} with the ReLU fused (Ex API)", step).c_str(), x_, st,
        ex_bn_ ? "the Ex API without the ReLU, then stepbench's ReLU" : "the non-Ex API, then stepbench's ReLU");
  }
  void* ex_ws(void* ws) const { return ex_ws_ ? static_cast<char*>(ws) + temp_ : nullptr; }
  // cuDNN's workspace (forward, backward) and reserve sizes for the Ex calls with these ops, or false
  // when it has no Ex kernel for them here
  bool ex_sizes(cudnnBatchNormOps_t ops, cudnnActivationDescriptor_t act, std::size_t& f, std::size_t& b,
                std::size_t& r) const {
    const bool fused = ops != CUDNN_BATCHNORM_OPS_BN;
    cudnnTensorDescriptor_t yd = fused ? yd_.get() : xd_.get();  // OPS_BN writes a dense y (x's descriptor)
    return cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(c_.cudnn, mode_, ops, xd_.get(), nullptr, yd,
                                                                    bnd_.get(), act, &f) == CUDNN_STATUS_SUCCESS &&
           cudnnGetBatchNormalizationBackwardExWorkspaceSize(c_.cudnn, mode_, ops, xd_.get(), fused ? yd : nullptr, yd,
                                                             nullptr, xd_.get(), bnd_.get(), act,
                                                             &b) == CUDNN_STATUS_SUCCESS &&
           cudnnGetBatchNormalizationTrainingExReserveSpaceSize(c_.cudnn, mode_, ops, act, xd_.get(), &r) ==
               CUDNN_STATUS_SUCCESS;
  }
  void set(Stream& s) {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDNN(cudnnSetStream(c_.cudnn, S(s)));
  }
  Ctx c_;
  BatchNormParams p_;
  TensorDesc x_, y_;
  TensorDescriptor xd_, yd_;
  TensorDescriptor bnd_;  // bn_param_descriptor
  ActivationDescriptor act_;
  cudnnBatchNormMode_t mode_ = CUDNN_BATCHNORM_SPATIAL;
  bool fused_ = false, ex_bn_ = false, bn_ok_ = false, own_ = false;
  std::size_t temp_ = 0, ex_ws_ = 0, reserve_ = 0, scratch_ = 0;
};

}  // namespace

std::unique_ptr<BatchNormOp> make_cuda_batch_norm(const Ctx& c, const TensorDesc& x, const TensorDesc& y,
                                                  const BatchNormParams& p) {
  return std::make_unique<CudaBatchNorm>(c, x, y, p);
}

}  // namespace stepbench::cuda
