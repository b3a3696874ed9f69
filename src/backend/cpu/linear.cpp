// Fully connected (inner product) on oneDNN: forward, backward data and backward weights
// primitives for one shape, created at planning time.
#include <algorithm>
#include <memory>

#include "backend/cpu/common.hpp"
#include "backend/cpu/onednn.hpp"

namespace stepbench::cpu {
namespace {

class DnnlLinear final : public LinearOp {
 public:
  DnnlLinear(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y) : strm_(strm), xdesc_(x) {
    require_dense(x, "linear");
    require_dense(y, "linear");
    SB_CHECK(x.shape.h == 1 && x.shape.w == 1 && y.shape.h == 1 && y.shape.w == 1 && x.shape.n == y.shape.n,
             "linear takes N x K x 1 x 1 inputs and N x M x 1 x 1 outputs");
    SB_CHECK(x.dtype == y.dtype, "linear: the input and output element types differ");
    // bf16: the weights and bias are the graph's 16-bit copies, their gradients 16-bit too (widened
    // into the fp32 arena by the graph); oneDNN accumulates in fp32
    const dt t = dnnl_type(x.dtype);
    const memory::desc xd({x.shape.n, x.shape.c}, t, tag::nc), yd({y.shape.n, y.shape.c}, t, tag::nc);
    const memory::desc wd({y.shape.c, x.shape.c}, t, tag::oi), bd({y.shape.c}, t, tag::a);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    fwd_pd_ = dnnl::inner_product_forward::primitive_desc(
        dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, xd, wd, bd, yd), attr, eng);
    bwd_data_pd_ = dnnl::inner_product_backward_data::primitive_desc(
        dnnl::inner_product_backward_data::desc(xd, wd, yd), attr, eng, fwd_pd_);
    bwd_w_pd_ = dnnl::inner_product_backward_weights::primitive_desc(
        dnnl::inner_product_backward_weights::desc(xd, wd, bd, yd), attr, eng, fwd_pd_);
    fwd_ = dnnl::inner_product_forward(fwd_pd_);
    bwd_data_ = dnnl::inner_product_backward_data(bwd_data_pd_);
    bwd_w_ = dnnl::inner_product_backward_weights(bwd_w_pd_);
    scratch_ = std::max({fwd_pd_.scratchpad_desc().get_size(), bwd_data_pd_.scratchpad_desc().get_size(),
                         bwd_w_pd_.scratchpad_desc().get_size()});
    mx_ = memory(xd, eng, DNNL_MEMORY_NONE);
    my_ = memory(yd, eng, DNNL_MEMORY_NONE);
    mw_ = memory(wd, eng, DNNL_MEMORY_NONE);
    mb_ = memory(bd, eng, DNNL_MEMORY_NONE);
    mscratch_ = scratchpad_memory(eng, scratch_);
  }
  std::size_t workspace_bytes() const override { return align_up(scratch_) + xdesc_.bytes(); }
  std::string implementation() const override {
    return fmt::format("fwd {} / bwd_data {} / bwd_weights {}", fwd_pd_.impl_info_str(), bwd_data_pd_.impl_info_str(),
                       bwd_w_pd_.impl_info_str());
  }
  void forward(Stream&, const Tensor& x, const void* w, const void* b, const Tensor& y, void* ws) override {
    point(mx_, x.data);
    point(mw_, w);
    point(mb_, b);
    point(my_, y.data);
    point(mscratch_, ws);
    fwd_.execute(strm_, {{DNNL_ARG_SRC, mx_},
                         {DNNL_ARG_WEIGHTS, mw_},
                         {DNNL_ARG_BIAS, mb_},
                         {DNNL_ARG_DST, my_},
                         {DNNL_ARG_SCRATCHPAD, mscratch_}});
  }
  void backward_data(Stream&, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    void* target = beta == 0.0f ? dx.data : static_cast<char*>(ws) + align_up(scratch_);
    point(my_, dy.data);
    point(mw_, w);
    point(mx_, target);
    point(mscratch_, ws);
    bwd_data_.execute(strm_, {{DNNL_ARG_DIFF_DST, my_},
                              {DNNL_ARG_WEIGHTS, mw_},
                              {DNNL_ARG_DIFF_SRC, mx_},
                              {DNNL_ARG_SCRATCHPAD, mscratch_}});
    if (beta != 0.0f) add(Tensor{target, xdesc_}, dx, beta);
  }
  void backward_weights(Stream&, const Tensor& x, const Tensor& dy, void* dw, void* db, void* ws) override {
    point(mx_, x.data);
    point(my_, dy.data);
    point(mw_, dw);
    point(mb_, db);
    point(mscratch_, ws);
    bwd_w_.execute(strm_, {{DNNL_ARG_SRC, mx_},
                           {DNNL_ARG_DIFF_DST, my_},
                           {DNNL_ARG_DIFF_WEIGHTS, mw_},
                           {DNNL_ARG_DIFF_BIAS, mb_},
                           {DNNL_ARG_SCRATCHPAD, mscratch_}});
  }

 private:
  dnnl::stream& strm_;
  TensorDesc xdesc_;
  dnnl::inner_product_forward::primitive_desc fwd_pd_;
  dnnl::inner_product_backward_data::primitive_desc bwd_data_pd_;
  dnnl::inner_product_backward_weights::primitive_desc bwd_w_pd_;
  dnnl::primitive fwd_, bwd_data_, bwd_w_;
  memory mx_, my_, mw_, mb_, mscratch_;
  std::size_t scratch_ = 0;
};

}  // namespace

std::unique_ptr<LinearOp> make_dnnl_linear(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                           const TensorDesc& y) {
  return std::make_unique<DnnlLinear>(eng, strm, x, y);
}

}  // namespace stepbench::cpu
