// Average pooling on oneDNN's kernel where it beats the hand-written one (pool.cpp): NHWC with a dense input and
// output. Measured alone on an AVX-512 EPYC, 2 threads, Inception-v3's pools at batch 8 (ms, hand-written / oneDNN's
// jit): forward 0.71 / 0.35 (35x35x192, 3x3 s1 p1), 1.41 / 0.46 (35x35x288), 0.53 / 0.29 (17x17x768), 0.18 / 0.10
// (8x8x1280); backward 0.73 / 0.51, 1.44 / 1.20, 0.59 / 0.44, 0.21 / 0.16. oneDNN's max pooling is faster too (forward
// 1.6-2.5x, backward 2.3-3.7x) but drops a NaN in its window (2 from {NaN, 1, 2}, where PyTorch gives NaN), so max
// pooling stays hand-written. Only oneDNN's AVX-512 jit kernels are taken (the ones measured). A strided view (a
// concat's channel slice) and a backward that adds to its dx (beta 1) run the hand-written kernel.
#include <memory>
#include <string>

#include "backend/cpu/common.hpp"
#include "backend/cpu/onednn.hpp"

namespace stepbench::cpu {
namespace {

class DnnlAvgPool final : public PoolOp {
 public:
  DnnlAvgPool(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y, const PoolParams& p,
              std::unique_ptr<PoolOp> fallback)
      : strm_(strm), fallback_(std::move(fallback)) {
    const memory::desc xd(dims4(x.shape), dt::f32, tag::nhwc), yd(dims4(y.shape), dt::f32, tag::nhwc);
    const auto alg = p.kind == PoolKind::avg_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                                         : dnnl::algorithm::pooling_avg_exclude_padding;
    // symmetric padding: oneDNN sizes the output with floor division, as PyTorch's floor mode does
    const memory::dims strides{p.stride_h, p.stride_w}, kernel{p.kh, p.kw}, dilation{0, 0}, pad{p.pad_h, p.pad_w};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // in the layer's reserve (PoolOp has no workspace)
    fwd_pd_ = dnnl::pooling_v2_forward::primitive_desc(
        dnnl::pooling_v2_forward::desc(dnnl::prop_kind::forward_training, alg, xd, yd, strides, kernel, dilation, pad,
                                       pad),
        attr, eng);
    bwd_pd_ = dnnl::pooling_v2_backward::primitive_desc(
        dnnl::pooling_v2_backward::desc(alg, xd, yd, strides, kernel, dilation, pad, pad), attr, eng, fwd_pd_);
    scratch_ = std::max(fwd_pd_.scratchpad_desc().get_size(), bwd_pd_.scratchpad_desc().get_size());
    scratch_mem_ = scratchpad_memory(eng, scratch_);
    fwd_ = dnnl::pooling_v2_forward(fwd_pd_);
    bwd_ = dnnl::pooling_v2_backward(bwd_pd_);
    x_ = memory(xd, eng, DNNL_MEMORY_NONE), y_ = memory(yd, eng, DNNL_MEMORY_NONE);
  }
  std::size_t reserve_bytes() const override { return std::max(fallback_->reserve_bytes(), scratch_); }
  // measured: oneDNN's AVX-512 jit kernels (elsewhere unmeasured)
  bool measured_faster() const {
    return std::string(fwd_pd_.impl_info_str()).rfind("jit:avx512", 0) == 0 &&
           std::string(bwd_pd_.impl_info_str()).rfind("jit:avx512", 0) == 0;
  }
  std::unique_ptr<PoolOp> release_fallback() { return std::move(fallback_); }
  std::string implementation() const override {
    return fmt::format("oneDNN {}; strided views: {}", fwd_pd_.impl_info_str(), fallback_->implementation());
  }
  void forward(Stream& s, const Tensor& x, const Tensor& y, void* reserve) override {
    if (!x.desc.is_dense() || !y.desc.is_dense()) return fallback_->forward(s, x, y, reserve);
    point(x_, x.data), point(y_, y.data), point(scratch_mem_, reserve);
    fwd_.execute(strm_, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DST, y_}, {DNNL_ARG_SCRATCHPAD, scratch_mem_}});
  }
  void backward(Stream& s, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta,
                const void* reserve) override {
    if (beta != 0.0f || !dy.desc.is_dense() || !dx.desc.is_dense())
      return fallback_->backward(s, x, y, dy, dx, beta, reserve);
    point(y_, dy.data), point(x_, dx.data), point(scratch_mem_, reserve);
    bwd_.execute(strm_, {{DNNL_ARG_DIFF_DST, y_}, {DNNL_ARG_DIFF_SRC, x_}, {DNNL_ARG_SCRATCHPAD, scratch_mem_}});
  }

 private:
  dnnl::stream& strm_;
  std::unique_ptr<PoolOp> fallback_;
  dnnl::pooling_v2_forward::primitive_desc fwd_pd_;
  dnnl::pooling_v2_backward::primitive_desc bwd_pd_;
  dnnl::primitive fwd_, bwd_;
  memory x_, y_, scratch_mem_;
  std::size_t scratch_ = 0;
};

}  // namespace

bool dnnl_pool_wins(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) {
  return p.kind != PoolKind::max && x.dtype == DType::f32 && x.layout == Layout::nhwc && x.is_dense() && y.is_dense();
}

std::unique_ptr<PoolOp> make_dnnl_pool(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y,
                                       const PoolParams& p, std::unique_ptr<PoolOp> fallback) {
  auto op = std::make_unique<DnnlAvgPool>(eng, strm, x, y, p, std::move(fallback));
  if (!op->measured_faster()) return op->release_fallback();
  return op;
}

}  // namespace stepbench::cpu
