// Convolution on oneDNN: forward, backward data and backward filter primitives for one shape,
// created at planning time.
#include <algorithm>
#include <memory>
#include <string>

#include "backend/cpu/common.hpp"
#include "backend/cpu/onednn.hpp"

namespace stepbench::cpu {
namespace {

// Planted faults (a test-only build: cmake -DSTEPBENCH_PLANT_FAULT=<n>), to show that the oracle,
// graph and parity tests catch real bugs: 1 filter gradient doubled, 2 filter gradient zero,
// 3 forward reads the filter transposed (kh <-> kw), 4 forward padding shifted by one pixel.
#ifndef STEPBENCH_PLANT_FAULT
#define STEPBENCH_PLANT_FAULT 0
#endif
class DnnlConv final : public ConvOp {
 public:
  DnnlConv(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y, const ConvParams& p,
           FilterFormat ff)
      : strm_(strm), ydesc_(y), xdesc_(x) {
    require_dense_f32(x, "convolution");
    require_dense_f32(y, "convolution");
    SB_CHECK(conv_output_shape(x.shape, y.shape.c, p) == y.shape, "convolution output shape mismatch");
    const memory::desc xd(dims4(x.shape), dt::f32, act_tag(x.layout));
    const memory::desc yd(dims4(y.shape), dt::f32, act_tag(y.layout));
    const memory::desc wd({y.shape.c, x.shape.c, p.kh, p.kw}, dt::f32, filter_tag(ff));
    const memory::dims strides{p.stride_h, p.stride_w}, pad{p.pad_h, p.pad_w};
#if STEPBENCH_PLANT_FAULT == 3
    // the same bytes read with the kernel's two spatial axes swapped
    const auto& bs = wd.data.format_desc.blocking.strides;
    memory::dims ws(bs, bs + 4);
    if (p.kh == p.kw) std::swap(ws[2], ws[3]);  // square kernels only: a permutation within the block
    const memory::desc wfd({y.shape.c, x.shape.c, p.kh, p.kw}, dt::f32, ws);
#else
    const memory::desc& wfd = wd;
#endif
#if STEPBENCH_PLANT_FAULT == 4
    const memory::dims pad_l{p.pad_h + (p.pad_h > 0), p.pad_w + (p.pad_w > 0)},
        pad_r{p.pad_h - (p.pad_h > 0), p.pad_w - (p.pad_w > 0)};
#else
    const memory::dims& pad_l = pad;
    const memory::dims& pad_r = pad;
#endif
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const auto alg = dnnl::algorithm::convolution_direct;
    // Where oneDNN has a direct kernel for its own (blocked) weight format, it gets the weights in
    // that format: reordered from the arena's plain filter before forward and backward-data, and the
    // filter gradient reordered back after backward-filter. Where gemm takes the shape, the plain
    // filter as it is (no reorders).
    const memory::desc wany({y.shape.c, x.shape.c, p.kh, p.kw}, dt::f32, tag::any);
    auto fwd_any = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, xd, wany, yd, strides, pad_l, pad_r),
        attr, eng);
    // gemm ("x64:gemm:jit", "gemm:..."; not "ip:any+brgemm:...", a direct kernel) takes the plain
    // filter; so does anything that asks for the arena's format itself. Planted fault 3 (the forward
    // reading the filter transposed) needs the plain path; the others hold on both.
    const std::string impl = fwd_any.impl_info_str();
    const bool gemm = impl.rfind("gemm", 0) == 0 || impl.find(":gemm") != std::string::npos;
    const bool blocked = STEPBENCH_PLANT_FAULT != 3 && !gemm && fwd_any.weights_desc() != wd;
    const memory::desc& wk = blocked ? wany : wd;
    if (blocked) {
      fwd_pd_ = fwd_any;
    } else {
      fwd_pd_ = dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, xd, wfd, yd, strides, pad_l, pad_r),
          attr, eng);
    }
    bwd_data_pd_ = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(alg, xd, wk, yd, strides, pad, pad), attr, eng, fwd_pd_);
    bwd_filter_pd_ = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(alg, xd, wk, yd, strides, pad, pad), attr, eng, fwd_pd_);
    fwd_ = dnnl::convolution_forward(fwd_pd_);
    bwd_data_ = dnnl::convolution_backward_data(bwd_data_pd_);
    bwd_filter_ = dnnl::convolution_backward_weights(bwd_filter_pd_);
    scratch_ = std::max({fwd_pd_.scratchpad_desc().get_size(), bwd_data_pd_.scratchpad_desc().get_size(),
                         bwd_filter_pd_.scratchpad_desc().get_size()});
    mx_ = memory(xd, eng, DNNL_MEMORY_NONE);
    my_ = memory(yd, eng, DNNL_MEMORY_NONE);
    mw_ = memory(wd, eng, DNNL_MEMORY_NONE);
    mscratch_ = scratchpad_memory(eng, scratch_);
    // The weights as each direction takes them; a reorder where that is not the arena's format.
    // The workspace: [scratchpad | backward-data's beta temporary | backward-data's weights]; the
    // forward's weights and backward-filter's gradient, one call at a time, where the temporary is.
    const std::size_t temp = align_up(scratch_), after_temp = temp + align_up(xdesc_.bytes());
    workspace_ = after_temp;
    auto direction = [&](const memory::desc& want, Reordered& r, bool to_plain, std::size_t at) {
      r.m = memory(want, eng, DNNL_MEMORY_NONE);
      if (!blocked || want == wd) return;  // plain: the caller's buffer (as fwd_pd_ reads it, faults included)
      r.offset = at;
      workspace_ = std::max(workspace_, at + align_up(want.get_size()));
      r.reorder = to_plain ? dnnl::reorder(r.m, mw_) : dnnl::reorder(mw_, r.m);
      r.needed = true;
    };
    direction(fwd_pd_.weights_desc(), fwd_w_, false, temp);
    direction(bwd_data_pd_.weights_desc(), bwd_data_w_, false, after_temp);
    direction(bwd_filter_pd_.diff_weights_desc(), bwd_filter_dw_, true, temp);
  }
  std::size_t workspace_bytes() const override { return workspace_; }
  std::string algorithm() const override {
    return fmt::format("fwd {} / bwd_data {} / bwd_filter {}", fwd_pd_.impl_info_str(), bwd_data_pd_.impl_info_str(),
                       bwd_filter_pd_.impl_info_str());
  }
  void forward(Stream&, const Tensor& x, const void* w, const Tensor& y, void* ws) override {
    point(mx_, x.data);
    point(my_, y.data);
    point(mscratch_, ws);
    fwd_.execute(strm_, {{DNNL_ARG_SRC, mx_},
                         {DNNL_ARG_WEIGHTS, weights_in(fwd_w_, w, ws)},
                         {DNNL_ARG_DST, my_},
                         {DNNL_ARG_SCRATCHPAD, mscratch_}});
  }
  void backward_data(Stream&, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    // oneDNN's backward-data has no sum post-op: accumulate through a planned temporary.
    void* target = beta == 0.0f ? dx.data : static_cast<char*>(ws) + align_up(scratch_);
    point(my_, dy.data);
    point(mx_, target);
    point(mscratch_, ws);
    bwd_data_.execute(strm_, {{DNNL_ARG_DIFF_DST, my_},
                              {DNNL_ARG_WEIGHTS, weights_in(bwd_data_w_, w, ws)},
                              {DNNL_ARG_DIFF_SRC, mx_},
                              {DNNL_ARG_SCRATCHPAD, mscratch_}});
    if (beta != 0.0f) add(Tensor{target, xdesc_}, dx, beta);
  }
  void backward_filter(Stream&, const Tensor& x, const Tensor& dy, void* dw, void* ws) override {
    point(mx_, x.data);
    point(my_, dy.data);
    point(mw_, dw);
    point(mscratch_, ws);
    Reordered& r = bwd_filter_dw_;
    if (r.needed) point(r.m, static_cast<char*>(ws) + r.offset);
    bwd_filter_.execute(strm_, {{DNNL_ARG_SRC, mx_},
                                {DNNL_ARG_DIFF_DST, my_},
                                {DNNL_ARG_DIFF_WEIGHTS, r.needed ? r.m : mw_},
                                {DNNL_ARG_SCRATCHPAD, mscratch_}});
    if (r.needed) r.reorder.execute(strm_, r.m, mw_);
#if STEPBENCH_PLANT_FAULT == 1 || STEPBENCH_PLANT_FAULT == 2
    float* g = static_cast<float*>(dw);
    for (std::size_t i = 0, n = mw_.get_desc().get_size() / sizeof(float); i < n; ++i)
      g[i] = STEPBENCH_PLANT_FAULT == 1 ? 2 * g[i] : 0.0f;
#endif
  }

 private:
  dnnl::stream& strm_;
  TensorDesc ydesc_, xdesc_;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd_;
  dnnl::convolution_backward_weights::primitive_desc bwd_filter_pd_;
  dnnl::primitive fwd_, bwd_data_, bwd_filter_;
  // One direction's weights: in the arena's format (needed false: the caller's buffer as it is), or
  // reordered through the workspace at `offset`.
  struct Reordered {
    memory m;
    dnnl::reorder reorder;
    std::size_t offset = 0;
    bool needed = false;
  };
  memory& weights_in(Reordered& r, const void* w, void* ws) {
    point(mw_, w);
    if (!r.needed) {
      point(r.m, w);
      return r.m;
    }
    point(r.m, static_cast<char*>(ws) + r.offset);
    r.reorder.execute(strm_, mw_, r.m);
    return r.m;
  }
  memory mx_, my_, mw_, mscratch_;
  Reordered fwd_w_, bwd_data_w_, bwd_filter_dw_;
  std::size_t scratch_ = 0, workspace_ = 0;
};

}  // namespace

std::unique_ptr<ConvOp> make_dnnl_conv(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y,
                                       const ConvParams& p, FilterFormat ff) {
  return std::make_unique<DnnlConv>(eng, strm, x, y, p, ff);
}

}  // namespace stepbench::cpu
