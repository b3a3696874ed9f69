// Batch norm on oneDNN's kernels where they beat the hand-written ones (batch_norm.cpp). Measured on
// an AVX-512 EPYC, 2 threads, Inception-v3's layers at batch 8:
// - alone (same tensors, warm): oneDNN's bnorm_jit 1.3-2.2x faster forward and backward at 71x71
//   to 149x149 pixels, the hand-written kernels as fast or faster at 35x35 and below, and oneDNN's
//   NCHW kernel (ncsp) 3-5x slower at 17x17 and larger (at 8x8x320 even forward, 1.4x backward);
// - in the step (--layer-times): the forward faster on all five stem layers (71x71 to 149x149;
//   50.3 to 30.4 ms for all of the network's batch norms); the backward, medians of three
//   interleaved runs each, hand-written against oneDNN: 3.22 / 2.94 ms at 149x149x32, 3.22 / 2.85 at
//   147x147x32, 8.88 / 5.82 at 147x147x64, 2.71 / 1.87 at 73x73x80, but 5.12 / 6.30 at 71x71x192.
// So: NHWC, dense output, at least 64x64 pixels: the forward on oneDNN, the backward too where the
// channels are at most 128; only oneDNN's AVX-512 jit kernels (the ones measured; with 16 channels
// or a multiple). A step whose statistics come out non-finite runs the hand-written forward (see
// forward_training). Everything else, the inference forward and any call on a strided view (a
// concat's channel slice, which oneDNN's jit kernels do not take), runs the hand-written kernel.
#include <cmath>
#include <memory>
#include <string>

#include "backend/cpu/common.hpp"
#include "backend/cpu/onednn.hpp"

namespace stepbench::cpu {
namespace {

using flags = dnnl::normalization_flags;

class DnnlBatchNorm final : public BatchNormOp {
 public:
  DnnlBatchNorm(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const BatchNormParams& p,
                std::unique_ptr<BatchNormOp> fallback)
      : strm_(strm), p_(p), c_(x.shape.c), fallback_(std::move(fallback)), dnnl_bwd_(x.shape.c <= 128) {
    const memory::desc d(dims4(x.shape), dt::f32, tag::nhwc), v({x.shape.c}, dt::f32, tag::a);
    const auto f = flags::use_scale | flags::use_shift | (p.relu ? flags::fuse_norm_relu : flags::none);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // in the graph's workspace, as every op's
    fwd_pd_ = dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, d, p.eps, f), attr, eng);
    bwd_pd_ = dnnl::batch_normalization_backward::primitive_desc(
        dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, d, d, p.eps, f), attr, eng, fwd_pd_);
    scratch_ = std::max(fwd_pd_.scratchpad_desc().get_size(), bwd_pd_.scratchpad_desc().get_size());
    // the recompute: the same kernel on the training forward's mean and variance (global statistics)
    re_pd_ = dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_inference, d, p.eps,
                                                f | flags::use_global_stats),
        attr, eng);
    scratch_ = std::max(scratch_, re_pd_.scratchpad_desc().get_size());
    scratch_mem_ = scratchpad_memory(eng, scratch_);
    re_ = dnnl::batch_normalization_forward(re_pd_);
    fwd_ = dnnl::batch_normalization_forward(fwd_pd_);
    bwd_ = dnnl::batch_normalization_backward(bwd_pd_);
    auto mem = [&](const memory::desc& md) { return memory(md, eng, DNNL_MEMORY_NONE); };
    x_ = mem(d), y_ = mem(d), dy_ = mem(d), dx_ = mem(d);
    gamma_ = mem(v), beta_ = mem(v), mean_ = mem(v), var_ = mem(v), dgamma_ = mem(v), dbeta_ = mem(v);
    ws_ = mem(fwd_pd_.workspace_desc());
    ws_bytes_ = align_up(fwd_pd_.workspace_desc().get_size());
  }
  // the ReLU mask oneDNN keeps for backward, then the batch variance (oneDNN's backward takes it, the
  // hand-written one 1/sqrt(var + eps))
  std::size_t reserve_bytes() const override {
    return std::max(fallback_->reserve_bytes(), ws_bytes_ + static_cast<std::size_t>(c_) * sizeof(float));
  }
  std::size_t workspace_bytes() const override { return std::max(fallback_->workspace_bytes(), scratch_); }
  // measured: oneDNN's AVX-512 jit kernels (elsewhere, e.g. bnorm_tbb_jit:avx2 or ncsp, unmeasured)
  bool measured_faster() const {
    const std::string impl = fwd_pd_.impl_info_str();
    // the recompute (global statistics) on the same kernel too: then it gives the forward's bits
    return impl.rfind("bnorm_jit:avx512", 0) == 0 && std::string(bwd_pd_.impl_info_str()) == impl &&
           std::string(re_pd_.impl_info_str()) == impl;
  }
  std::unique_ptr<BatchNormOp> release_fallback() { return std::move(fallback_); }
  std::string implementation() const override {
    return fmt::format("oneDNN {}{}, backward {}; strided views: {}", fwd_pd_.impl_info_str(),
                       p_.relu ? " (relu fused)" : "", dnnl_bwd_ ? "oneDNN" : fallback_->implementation(),
                       fallback_->implementation());
  }
  void forward_training(Stream& s, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                        float* running_mean, float* running_var, float* save_mean, float* save_invstd, void* ws,
                        void* reserve) override {
    dnnl_fwd_ = x.desc.is_dense() && y.desc.is_dense();
    if (!dnnl_fwd_) {
      fallback_->forward_training(s, x, y, gamma, beta, running_mean, running_var, save_mean, save_invstd, ws, reserve);
      return;
    }
    float* var = variance(reserve);
    point(x_, x.data), point(y_, y.data), point(gamma_, gamma), point(beta_, beta), point(mean_, save_mean);
    point(var_, var), point(ws_, reserve), point(scratch_mem_, ws);
    fwd_.execute(strm_, {{DNNL_ARG_SRC, x_},
                         {DNNL_ARG_DST, y_},
                         {DNNL_ARG_SCALE, gamma_},
                         {DNNL_ARG_SHIFT, beta_},
                         {DNNL_ARG_MEAN, mean_},
                         {DNNL_ARG_VARIANCE, var_},
                         {DNNL_ARG_WORKSPACE, ws_},
                         {DNNL_ARG_SCRATCHPAD, scratch_mem_}});
    // A NaN or infinity in a channel makes its statistics non-finite, and oneDNN's fused ReLU then
    // writes 0 where PyTorch (and the hand-written kernel) keep NaN: that step runs the hand-written
    // forward instead, so a diverged network shows NaN where PyTorch's would
    for (std::int64_t c = 0; c < c_; ++c)
      if (!std::isfinite(save_mean[c]) || !std::isfinite(var[c])) {
        dnnl_fwd_ = false;
        fallback_->forward_training(s, x, y, gamma, beta, running_mean, running_var, save_mean, save_invstd, ws,
                                    reserve);
        return;
      }
    // what the hand-written kernel saves, and PyTorch's running statistics (unbiased variance)
    const double M = static_cast<double>(x.shape().n * x.shape().h * x.shape().w);
    for (std::int64_t c = 0; c < c_; ++c) {
      const double v = var[c];
      save_invstd[c] = static_cast<float>(1.0 / std::sqrt(v + p_.eps));
      const double unbiased = M > 1 ? v * M / (M - 1) : v;
      running_mean[c] = static_cast<float>((1 - p_.momentum) * running_mean[c] + p_.momentum * save_mean[c]);
      running_var[c] = static_cast<float>((1 - p_.momentum) * running_var[c] + p_.momentum * unbiased);
    }
  }
  void forward_inference(Stream& s, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                         const float* running_mean, const float* running_var, void* ws) override {
    fallback_->forward_inference(s, x, y, gamma, beta, running_mean, running_var, ws);
  }
  // After a training forward on oneDNN: its kernel again with that forward's mean and variance; after
  // one on the hand-written kernel (a strided view, non-finite statistics): that kernel's recompute.
  void forward_recompute(Stream& s, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                         const float* save_mean, const float* save_invstd, void* ws, const void* reserve) override {
    if (!dnnl_fwd_ || !x.desc.is_dense() || !y.desc.is_dense()) {
      fallback_->forward_recompute(s, x, y, gamma, beta, save_mean, save_invstd, ws, reserve);
      return;
    }
    point(x_, x.data), point(y_, y.data), point(gamma_, gamma), point(beta_, beta), point(mean_, save_mean);
    point(var_, variance(const_cast<void*>(reserve))), point(scratch_mem_, ws);
    re_.execute(strm_, {{DNNL_ARG_SRC, x_},
                        {DNNL_ARG_DST, y_},
                        {DNNL_ARG_SCALE, gamma_},
                        {DNNL_ARG_SHIFT, beta_},
                        {DNNL_ARG_MEAN, mean_},
                        {DNNL_ARG_VARIANCE, var_},
                        {DNNL_ARG_SCRATCHPAD, scratch_mem_}});
  }
  void backward(Stream& s, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* gamma,
                const float* beta, const float* save_mean, const float* save_invstd, float* dgamma, float* dbeta,
                float beta_dx, void* ws, const void* reserve) override {
    // oneDNN's backward overwrites dx and needs its forward's mask: else the hand-written kernel,
    // which reads the mask from y and 1/sqrt(var + eps) from save_invstd
    if (!dnnl_bwd_ || !dnnl_fwd_ || beta_dx != 0.0f || !dy.desc.is_dense() || !dx.desc.is_dense()) {
      fallback_->backward(s, x, y, dy, dx, gamma, beta, save_mean, save_invstd, dgamma, dbeta, beta_dx, ws, reserve);
      return;
    }
    point(x_, x.data), point(dy_, dy.data), point(dx_, dx.data), point(gamma_, gamma), point(beta_, beta);
    point(mean_, save_mean);
    point(var_, variance(const_cast<void*>(reserve))), point(ws_, reserve), point(dgamma_, dgamma);
    point(dbeta_, dbeta), point(scratch_mem_, ws);
    bwd_.execute(strm_, {{DNNL_ARG_SRC, x_},
                         {DNNL_ARG_DIFF_DST, dy_},
                         {DNNL_ARG_SCALE, gamma_},
                         {DNNL_ARG_SHIFT, beta_},
                         {DNNL_ARG_MEAN, mean_},
                         {DNNL_ARG_VARIANCE, var_},
                         {DNNL_ARG_WORKSPACE, ws_},
                         {DNNL_ARG_DIFF_SRC, dx_},
                         {DNNL_ARG_DIFF_SCALE, dgamma_},
                         {DNNL_ARG_DIFF_SHIFT, dbeta_},
                         {DNNL_ARG_SCRATCHPAD, scratch_mem_}});
  }

 private:
  float* variance(void* reserve) const { return reinterpret_cast<float*>(static_cast<char*>(reserve) + ws_bytes_); }
  dnnl::stream& strm_;
  BatchNormParams p_;
  std::int64_t c_;
  std::unique_ptr<BatchNormOp> fallback_;
  dnnl::batch_normalization_forward::primitive_desc fwd_pd_;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd_;
  dnnl::batch_normalization_forward::primitive_desc re_pd_;
  dnnl::primitive fwd_, bwd_, re_;
  memory x_, y_, dy_, dx_, gamma_, beta_, mean_, var_, dgamma_, dbeta_, ws_, scratch_mem_;
  std::size_t ws_bytes_ = 0, scratch_ = 0;
  bool dnnl_bwd_;          // the backward on oneDNN too (at most 128 channels)
  bool dnnl_fwd_ = false;  // the last training forward ran oneDNN (its mask and variance are in reserve)
};

}  // namespace

bool dnnl_batch_norm_wins(const TensorDesc& x, const TensorDesc& y) {
  return x.dtype == DType::f32 && x.layout == Layout::nhwc && x.is_dense() && y.is_dense() &&
         x.shape.h * x.shape.w >= kDnnlBatchNormMinPixels;
}

std::unique_ptr<BatchNormOp> make_dnnl_batch_norm(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                                  const BatchNormParams& p, std::unique_ptr<BatchNormOp> fallback) {
  auto op = std::make_unique<DnnlBatchNorm>(eng, strm, x, p, std::move(fallback));
  if (!op->measured_faster()) return op->release_fallback();
  return op;
}

}  // namespace stepbench::cpu
