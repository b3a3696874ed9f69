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
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// oneDNN's choice for one convolution's forward: on the arena's plain tensors (gemm), on its own
// (blocked) weights (a direct kernel), or on blocked weights and activations (NCHW's direct kernels).
struct Choice {
  memory::desc xd, yd, wd;  // the plain tensors; wd in the arena's plain filter format
  dnnl::convolution_forward::primitive_desc fwd;
  bool blocked = false, act_blocked = false;
};

Choice choose(const dnnl::engine& eng, const TensorDesc& x, const TensorDesc& y, const ConvParams& p, FilterFormat ff) {
  Choice c;
  const dt t = dnnl_type(x.dtype);  // bf16: oneDNN's bf16 kernels, fp32 accumulation
  c.xd = memory::desc(dims4(x.shape), t, act_tag(x.layout));
  c.yd = memory::desc(dims4(y.shape), t, act_tag(y.layout));
  const memory::dims wdims = filter_dims(y.shape.c, x.shape.c, p);
  c.wd = memory::desc(wdims, t, filter_tag(ff, p.groups));
  const memory::desc &xd = c.xd, &yd = c.yd, &wd = c.wd;
  const memory::dims strides{p.stride_h, p.stride_w}, pad{p.pad_h, p.pad_w};
#if STEPBENCH_PLANT_FAULT == 3
  // the same bytes read with the kernel's two spatial axes swapped
  const auto& bs = wd.data.format_desc.blocking.strides;
  memory::dims ws(bs, bs + wd.data.ndims);
  if (p.kh == p.kw && p.groups == 1) std::swap(ws[2], ws[3]);  // square kernels only: a permutation within the block
  const memory::desc wfd(wdims, t, ws);
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
  const dnnl::primitive_attr attr = user_scratchpad();
  const auto alg = dnnl::algorithm::convolution_direct;
  // Where oneDNN has a direct kernel for its own (blocked) formats, it gets its operands in them:
  // the filter as the arena keeps it (Backend::conv_filter_storage) or reordered through the
  // workspace from the arena's plain filter and, in NCHW, the plain activations reordered in and
  // out (what PyTorch's NCHW convolutions do too). Where gemm takes the shape, the plain tensors
  // as they are (no reorders). NHWC activations stay plain: oneDNN's NHWC kernels (brgconv) read
  // them directly.
  const memory::desc wany(wdims, t, tag::any);
  auto forward_pd = [&](const memory::desc& src, const memory::desc& w, const memory::desc& dst) {
    return dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src, w, dst, strides, pad_l, pad_r),
        attr, eng);
  };
  // gemm ("x64:gemm:jit", "gemm:..."; not "ip:any+brgemm:...", a direct kernel) takes the plain
  // tensors; so does anything that asks for the arena's formats itself. Planted fault 3 (the
  // forward reading the filter transposed) needs the plain path; the others hold on all paths.
  auto is_gemm = [](const std::string& impl) {
    return impl.rfind("gemm", 0) == 0 || impl.find(":gemm") != std::string::npos;
  };
  if (STEPBENCH_PLANT_FAULT != 3 && x.layout == Layout::nchw) {
    const memory::desc xany(dims4(x.shape), t, tag::any), yany(dims4(y.shape), t, tag::any);
    auto pd = forward_pd(xany, wany, yany);
    if (!is_gemm(pd.impl_info_str()) && (pd.src_desc() != xd || pd.dst_desc() != yd)) {
      c.fwd = pd;
      c.blocked = c.act_blocked = true;
    }
  }
  if (STEPBENCH_PLANT_FAULT != 3 && !c.act_blocked) {
    auto pd = forward_pd(xd, wany, yd);
    if (!is_gemm(pd.impl_info_str()) && pd.weights_desc() != wd) {
      c.fwd = pd;
      c.blocked = true;
    }
  }
  if (!c.blocked) c.fwd = forward_pd(xd, wfd, yd);
  return c;
}

// oneDNN's naming of a format: the dimensions outermost first (capital where blocked), then the
// blocks ("ABcd16b16a": O and I blocked by 16, I's block inside O's).
std::string format_name(const memory::desc& d) {
  const auto& md = d.data;
  const auto& b = md.format_desc.blocking;
  std::vector<int> order(static_cast<std::size_t>(md.ndims));
  for (int i = 0; i < md.ndims; ++i) order[static_cast<std::size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return b.strides[a] > b.strides[c]; });
  std::string s;
  for (int i : order) {
    bool split = false;
    for (int k = 0; k < b.inner_nblks; ++k) split = split || b.inner_idxs[k] == i;
    s += static_cast<char>((split ? 'A' : 'a') + i);
  }
  for (int k = 0; k < b.inner_nblks; ++k)
    s += fmt::format("{}{}", b.inner_blks[k], static_cast<char>('a' + b.inner_idxs[k]));
  return s;
}

// The same layout (blocking, padding) with fp32 elements: a bf16 filter's master copy in the fp32
// arena is kept in its format element for element, so that the graph's element-wise cast makes the
// 16-bit filter the bf16 kernel reads (its VNNI pairs, "...16a2b", included).
memory::desc as_f32(const memory::desc& d) {
  memory::desc f = d;
  f.data.data_type = dnnl_f32;
  return f;
}

// A filter kept in the format oneDNN's forward chose: converted by reorders from and to O,I,KH,KW.
// It keeps that choice, which the convolution of its shapes reuses (one search per shape).
class DnnlFilterStorage final : public FilterStorage {
 public:
  DnnlFilterStorage(const dnnl::engine& eng, Choice c, const memory::dims& oihw, int groups, std::string key)
      : eng_(eng),
        choice_(std::move(c)),
        stored_(as_f32(choice_.fwd.weights_desc())),
        plain_(oihw, dt::f32, filter_tag(FilterFormat::oihw, groups)),
        key_(std::move(key)) {}
  std::size_t floats() const override { return stored_.get_size() / sizeof(float); }  // elements, padding included
  std::string name() const override { return format_name(stored_); }
  void to_storage(const float* oihw, float* dst) const override { convert(oihw, plain_, dst, stored_); }
  void from_storage(const float* src, float* oihw) const override { convert(src, stored_, oihw, plain_); }
  const Choice& choice() const { return choice_; }
  const std::string& key() const { return key_; }  // the shapes it was chosen for

 private:
  void convert(const float* src, const memory::desc& from, float* dst, const memory::desc& to) const {
    dnnl::engine eng = eng_;
    dnnl::stream strm(eng);
    memory a(from, eng, const_cast<float*>(src)), b(to, eng, dst);
    dnnl::reorder(a, b).execute(strm, a, b);  // zeroes the padding of a blocked destination
    strm.wait();
  }
  dnnl::engine eng_;
  Choice choice_;
  memory::desc stored_, plain_;
  std::string key_;
};

class DnnlConv final : public ConvOp {
 public:
  // stored: where the arena keeps the filter in oneDNN's own format, the choice that format came
  // from (DnnlFilterStorage), else null (the plain `ff`, and a choice of its own).
  DnnlConv(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y, const ConvParams& p,
           FilterFormat ff, const Choice* stored)
      : strm_(strm), ydesc_(y), xdesc_(x) {
    require_dense(x, "convolution");
    require_dense(y, "convolution");
    SB_CHECK(x.dtype == y.dtype, "convolution: the input and output element types differ");
    SB_CHECK(conv_output_shape(x.shape, y.shape.c, p) == y.shape, "convolution output shape mismatch");
    const Choice c = stored ? *stored : choose(eng, x, y, p, ff);
    SB_CHECK(!stored || c.blocked, "convolution: a filter in oneDNN's own format where oneDNN chose the plain one");
    fwd_pd_ = c.fwd;
    const bool blocked = c.blocked, act_blocked = c.act_blocked;
    act_blocked_ = act_blocked;
    const memory::desc &xd = c.xd, &yd = c.yd;
    // the stored filter as the forward takes it: no reorder (re-pointing the memory object at it
    // zeroes its padding, which is zero already)
    const memory::desc wd = stored ? c.fwd.weights_desc() : c.wd;
    stored_ = stored != nullptr;
    const dnnl::primitive_attr attr = user_scratchpad();
    const auto alg = dnnl::algorithm::convolution_direct;
    const memory::dims strides{p.stride_h, p.stride_w}, pad{p.pad_h, p.pad_w};
    const dt t = dnnl_type(x.dtype);
    const memory::desc wany(filter_dims(y.shape.c, x.shape.c, p), t, tag::any);
    const memory::desc any_x = act_blocked ? memory::desc(dims4(x.shape), t, tag::any) : xd;
    const memory::desc any_y = act_blocked ? memory::desc(dims4(y.shape), t, tag::any) : yd;
    const memory::desc& wk = blocked ? wany : wd;
    bwd_data_pd_ = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(alg, any_x, wk, any_y, strides, pad, pad), attr, eng, fwd_pd_);
    bwd_filter_pd_ = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(alg, any_x, wk, any_y, strides, pad, pad), attr, eng, fwd_pd_);
    // oneDNN 2.6's jit_1x1:avx2 backward-weights on a strided NHWC source whose channels are not a
    // multiple of 8 computes wrong filter gradients with two threads and corrupts the heap with one
    // (found with ResNet's downsample shape in the tests' small nets; reproduced on oneDNN alone,
    // ONEDNN_MAX_CPU_ISA=AVX2): there the arena's plain filter format, on which it runs gemm (the
    // gradient reordered into the stored format through the workspace as any other staged operand)
    if (std::string(bwd_filter_pd_.impl_info_str()) == "jit_1x1:avx2" && x.layout == Layout::nhwc &&
        (p.stride_h > 1 || p.stride_w > 1) && x.shape.c % 8 != 0)
      bwd_filter_pd_ = dnnl::convolution_backward_weights::primitive_desc(
          dnnl::convolution_backward_weights::desc(alg, xd, c.wd, yd, strides, pad, pad), attr, eng, fwd_pd_);
    fwd_ = dnnl::convolution_forward(fwd_pd_);
    bwd_data_ = dnnl::convolution_backward_data(bwd_data_pd_);
    bwd_filter_ = dnnl::convolution_backward_weights(bwd_filter_pd_);
    scratch_ = std::max({fwd_pd_.scratchpad_desc().get_size(), bwd_data_pd_.scratchpad_desc().get_size(),
                         bwd_filter_pd_.scratchpad_desc().get_size()});
    mx_ = memory(xd, eng, DNNL_MEMORY_NONE);
    my_ = memory(yd, eng, DNNL_MEMORY_NONE);
    mw_ = memory(wd, eng, DNNL_MEMORY_NONE);
    mscratch_ = scratchpad_memory(eng, scratch_);
    // Each operand as its direction takes it: the caller's buffer where that is the plain format,
    // else a reorder through the workspace. The workspace, per direction: the scratchpad, then
    // (where backward-data writes a plain dx) its beta temporary, then that direction's reordered
    // operands.
    const std::size_t base = align_up(scratch_);
    // the temporary wherever backward-data writes the plain dx itself (beta 1 adds it afterwards)
    const bool dx_staged = blocked && bwd_data_pd_.diff_src_desc() != xd;
    const std::size_t temp_end = base + (dx_staged ? 0 : align_up(xdesc_.bytes()));
    workspace_ = temp_end;
    // out: an output, reordered back after the call; accumulate: also a reorder that adds (beta 1)
    auto stage = [&](std::size_t& cursor, const memory::desc& want, const memory& plain, Staged& s, bool out,
                     bool accumulate = false) {
      s.m = memory(want, eng, DNNL_MEMORY_NONE);
      if (!blocked || want == plain.get_desc()) return;  // plain: the caller's buffer (faults included)
      s.offset = cursor;
      cursor += align_up(want.get_size());
      workspace_ = std::max(workspace_, cursor);
      s.reorder = out ? dnnl::reorder(s.m, plain) : dnnl::reorder(plain, s.m);
      if (accumulate) {  // backward-data's beta 1: the reorder adds to what the plain buffer holds
        dnnl::primitive_attr sum;
        dnnl::post_ops po;
        po.append_sum(1.0f);
        sum.set_post_ops(po);
        s.add = dnnl::reorder(s.m, plain, sum);
      }
      s.needed = true;
    };
    std::size_t f = base, d = temp_end, g = base;
    stage(f, fwd_pd_.weights_desc(), mw_, fwd_w_, false);
    stage(f, fwd_pd_.src_desc(), mx_, fwd_x_, false);
    stage(f, fwd_pd_.dst_desc(), my_, fwd_y_, true);
    stage(d, bwd_data_pd_.weights_desc(), mw_, bwd_data_w_, false);
    stage(d, bwd_data_pd_.diff_dst_desc(), my_, bwd_data_dy_, false);
    stage(d, bwd_data_pd_.diff_src_desc(), mx_, bwd_data_dx_, true, true);
    SB_CHECK(bwd_data_dx_.needed == dx_staged, "convolution: backward-data's temporary planned for the wrong path");
    stage(g, bwd_filter_pd_.diff_weights_desc(), mw_, bwd_filter_dw_, true);
    stage(g, bwd_filter_pd_.src_desc(), mx_, bwd_filter_x_, false);
    stage(g, bwd_filter_pd_.diff_dst_desc(), my_, bwd_filter_dy_, false);
  }
  std::size_t workspace_bytes() const override { return workspace_; }
  std::string algorithm() const override {
    return fmt::format("fwd {} / bwd_data {} / bwd_filter {}{}{}", fwd_pd_.impl_info_str(),
                       bwd_data_pd_.impl_info_str(), bwd_filter_pd_.impl_info_str(),
                       act_blocked_ ? " (activations reordered to blocked)" : "",
                       stored_ ? " (filter kept in oneDNN's format)" : "");
  }
  void forward(Stream&, const Tensor& x, const void* w, const Tensor& y, void* ws) override {
    point(mscratch_, ws);
    fwd_.execute(strm_, {{DNNL_ARG_SRC, in(fwd_x_, mx_, x.data, ws)},
                         {DNNL_ARG_WEIGHTS, in(fwd_w_, mw_, w, ws)},
                         {DNNL_ARG_DST, out(fwd_y_, my_, y.data, ws)},
                         {DNNL_ARG_SCRATCHPAD, mscratch_}});
    done(fwd_y_, my_, false);
  }
  void backward_data(Stream&, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    SB_CHECK(beta == 0.0f || beta == 1.0f, "convolution backward-data: beta is 0 (overwrite) or 1 (add)");
    // oneDNN's backward-data has no sum post-op: on the plain path, accumulate through a planned
    // temporary; a reordered gradient is added by its reorder back.
    const bool staged = bwd_data_dx_.needed;
    void* target = beta == 0.0f || staged ? dx.data : static_cast<char*>(ws) + align_up(scratch_);
    point(mscratch_, ws);
    bwd_data_.execute(strm_, {{DNNL_ARG_DIFF_DST, in(bwd_data_dy_, my_, dy.data, ws)},
                              {DNNL_ARG_WEIGHTS, in(bwd_data_w_, mw_, w, ws)},
                              {DNNL_ARG_DIFF_SRC, out(bwd_data_dx_, mx_, target, ws)},
                              {DNNL_ARG_SCRATCHPAD, mscratch_}});
    done(bwd_data_dx_, mx_, beta != 0.0f);
    if (beta != 0.0f && !staged) add(Tensor{target, xdesc_}, dx, beta);
  }
  void backward_filter(Stream&, const Tensor& x, const Tensor& dy, void* dw, void* ws) override {
    point(mscratch_, ws);
    bwd_filter_.execute(strm_, {{DNNL_ARG_SRC, in(bwd_filter_x_, mx_, x.data, ws)},
                                {DNNL_ARG_DIFF_DST, in(bwd_filter_dy_, my_, dy.data, ws)},
                                {DNNL_ARG_DIFF_WEIGHTS, out(bwd_filter_dw_, mw_, dw, ws)},
                                {DNNL_ARG_SCRATCHPAD, mscratch_}});
    done(bwd_filter_dw_, mw_, false);
#if STEPBENCH_PLANT_FAULT == 1 || STEPBENCH_PLANT_FAULT == 2
    if (xdesc_.dtype == DType::bf16) {
      auto* g = static_cast<std::uint16_t*>(dw);
      for (std::size_t i = 0, n = mw_.get_desc().get_size() / 2; i < n; ++i)
        g[i] = STEPBENCH_PLANT_FAULT == 1 ? float_to_bf16(2 * bf16_to_float(g[i])) : 0;
    } else {
      float* g = static_cast<float*>(dw);
      for (std::size_t i = 0, n = mw_.get_desc().get_size() / sizeof(float); i < n; ++i)
        g[i] = STEPBENCH_PLANT_FAULT == 1 ? 2 * g[i] : 0.0f;
    }
#endif
  }

 private:
  dnnl::stream& strm_;
  TensorDesc ydesc_, xdesc_;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd_;
  dnnl::convolution_backward_weights::primitive_desc bwd_filter_pd_;
  dnnl::primitive fwd_, bwd_data_, bwd_filter_;
  // One operand of one direction: in the arena's format (needed false: the caller's buffer as it
  // is), or staged in the workspace at `offset` and reordered from (an input) or to (an output) the
  // plain buffer; `add` is an output's reorder that adds to the plain buffer.
  struct Staged {
    memory m;
    dnnl::reorder reorder, add;
    std::size_t offset = 0;
    bool needed = false;
  };
  memory& in(Staged& s, memory& plain, const void* p, void* ws) {
    point(plain, p);
    if (!s.needed) {
      point(s.m, p);
      return s.m;
    }
    point(s.m, static_cast<char*>(ws) + s.offset);
    s.reorder.execute(strm_, plain, s.m);
    return s.m;
  }
  memory& out(Staged& s, memory& plain, const void* p, void* ws) {
    point(plain, p);
    point(s.m, s.needed ? static_cast<char*>(ws) + s.offset : p);
    return s.m;
  }
  void done(Staged& s, memory& plain, bool accumulate) {
    if (s.needed) (accumulate ? s.add : s.reorder).execute(strm_, s.m, plain);
  }
  memory mx_, my_, mw_, mscratch_;
  Staged fwd_w_, fwd_x_, fwd_y_, bwd_data_w_, bwd_data_dy_, bwd_data_dx_, bwd_filter_dw_, bwd_filter_x_, bwd_filter_dy_;
  std::size_t scratch_ = 0, workspace_ = 0;
  bool act_blocked_ = false, stored_ = false;
};

}  // namespace

std::unique_ptr<ConvOp> make_dnnl_conv(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y,
                                       const ConvParams& p, FilterFormat ff) {
  return std::make_unique<DnnlConv>(eng, strm, x, y, p, ff, nullptr);
}

std::string dnnl_conv_key(const TensorDesc& x, const TensorDesc& y, const ConvParams& p) {
  return fmt::format("{}{} {}x{}x{}x{} -> {}x{}x{} k{}x{} s{}x{} p{}x{}{}", to_string(x.layout),
                     x.dtype == DType::bf16 ? " bf16" : "", x.shape.n, x.shape.c, x.shape.h, x.shape.w, y.shape.c,
                     y.shape.h, y.shape.w, p.kh, p.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w,
                     p.groups > 1 ? fmt::format(" g{}", p.groups) : "");
}

std::shared_ptr<const FilterStorage> dnnl_filter_storage(const dnnl::engine& eng, const TensorDesc& x,
                                                         const TensorDesc& y, const ConvParams& p, FilterFormat ff) {
  if ((x.dtype != DType::f32 && x.dtype != DType::bf16) || y.dtype != x.dtype || !x.is_dense() || !y.is_dense() ||
      conv_output_shape(x.shape, y.shape.c, p) != y.shape)
    return nullptr;  // make_conv says why
  Choice c = choose(eng, x, y, p, ff);
  if (!c.blocked) return nullptr;
  return std::make_shared<DnnlFilterStorage>(eng, std::move(c), filter_dims(y.shape.c, x.shape.c, p), p.groups,
                                             dnnl_conv_key(x, y, p));
}

std::unique_ptr<ConvOp> make_dnnl_conv_stored(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                              const TensorDesc& y, const ConvParams& p, FilterFormat ff,
                                              const FilterStorage& w) {
  const auto* s = dynamic_cast<const DnnlFilterStorage*>(&w);
  SB_CHECK(s, fmt::format("convolution: a filter storage ({}) that is not oneDNN's", w.name()));
  SB_CHECK(s->key() == dnnl_conv_key(x, y, p),
           fmt::format("convolution {}: a filter storage chosen for {}", dnnl_conv_key(x, y, p), s->key()));
  return std::make_unique<DnnlConv>(eng, strm, x, y, p, ff, &s->choice());
}

}  // namespace stepbench::cpu
