// The CPU backend: convolution and fully connected on oneDNN 2.6 (v2 API), the rest in
// cpu_kernels.cpp. All primitives are created at planning time; execute calls re-point memory
// objects at the caller's buffers and run.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <oneapi/dnnl/dnnl.hpp>

#include "cpu/cpu_kernels.hpp"
#include "stepbench/backend.hpp"
#include "stepbench/error.hpp"

namespace stepbench {
namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

struct CpuStream final : Stream {};
struct CpuEvent final : Event {
  std::chrono::steady_clock::time_point t{};
};

tag act_tag(Layout l) { return l == Layout::nchw ? tag::nchw : tag::nhwc; }
tag filter_tag(FilterFormat f) {
  switch (f) {
    case FilterFormat::oihw: return tag::oihw;
    case FilterFormat::hwio: return tag::hwio;
    case FilterFormat::ohwi: return tag::ohwi;
  }
  return tag::oihw;
}
memory::dims dims4(const Shape& s) { return {s.n, s.c, s.h, s.w}; }
std::size_t align_up(std::size_t v, std::size_t a = 64) { return (v + a - 1) / a * a; }

void require_dense_f32(const TensorDesc& d, const char* op) {
  if (d.dtype != DType::f32)
    throw UnsupportedError(fmt::format("{}: the cpu backend computes in fp32 only", op));
  SB_CHECK(d.is_dense(), fmt::format("{}: the cpu backend needs a dense {} tensor, got a strided view", op,
                                     to_string(d.layout)));
}

// ---- convolution ---------------------------------------------------------------------------------
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
    fwd_pd_ = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, xd, wfd, yd, strides, pad_l, pad_r),
        attr, eng);
    bwd_data_pd_ = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(alg, xd, wd, yd, strides, pad, pad), attr, eng, fwd_pd_);
    bwd_filter_pd_ = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(alg, xd, wd, yd, strides, pad, pad), attr, eng, fwd_pd_);
    fwd_ = dnnl::convolution_forward(fwd_pd_);
    mwf_ = memory(fwd_pd_.weights_desc(), eng, DNNL_MEMORY_NONE);
    bwd_data_ = dnnl::convolution_backward_data(bwd_data_pd_);
    bwd_filter_ = dnnl::convolution_backward_weights(bwd_filter_pd_);
    scratch_ = std::max({fwd_pd_.scratchpad_desc().get_size(), bwd_data_pd_.scratchpad_desc().get_size(),
                         bwd_filter_pd_.scratchpad_desc().get_size()});
    mx_ = memory(xd, eng, DNNL_MEMORY_NONE);
    my_ = memory(yd, eng, DNNL_MEMORY_NONE);
    mw_ = memory(wd, eng, DNNL_MEMORY_NONE);
    mscratch_ = memory(memory::desc({static_cast<memory::dim>(std::max<std::size_t>(scratch_, 1))}, dt::u8, tag::a),
                       eng, DNNL_MEMORY_NONE);
  }
  std::size_t workspace_bytes() const override { return align_up(scratch_) + xdesc_.bytes(); }
  std::string algorithm() const override {
    return fmt::format("fwd {} / bwd_data {} / bwd_filter {}", fwd_pd_.impl_info_str(),
                       bwd_data_pd_.impl_info_str(), bwd_filter_pd_.impl_info_str());
  }
  void forward(Stream&, const Tensor& x, const void* w, const Tensor& y, void* ws) override {
    point(mx_, x.data); point(mwf_, w); point(my_, y.data); point(mscratch_, ws);
    fwd_.execute(strm_, {{DNNL_ARG_SRC, mx_}, {DNNL_ARG_WEIGHTS, mwf_}, {DNNL_ARG_DST, my_},
                         {DNNL_ARG_SCRATCHPAD, mscratch_}});
  }
  void backward_data(Stream&, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    // oneDNN's backward-data has no sum post-op: accumulate through a planned temporary.
    void* target = beta == 0.0f ? dx.data : static_cast<char*>(ws) + align_up(scratch_);
    point(my_, dy.data); point(mw_, w); point(mx_, target); point(mscratch_, ws);
    bwd_data_.execute(strm_, {{DNNL_ARG_DIFF_DST, my_}, {DNNL_ARG_WEIGHTS, mw_}, {DNNL_ARG_DIFF_SRC, mx_},
                              {DNNL_ARG_SCRATCHPAD, mscratch_}});
    if (beta != 0.0f) cpu::add(Tensor{target, xdesc_}, dx, beta);
  }
  void backward_filter(Stream&, const Tensor& x, const Tensor& dy, void* dw, void* ws) override {
    point(mx_, x.data); point(my_, dy.data); point(mw_, dw); point(mscratch_, ws);
    bwd_filter_.execute(strm_, {{DNNL_ARG_SRC, mx_}, {DNNL_ARG_DIFF_DST, my_}, {DNNL_ARG_DIFF_WEIGHTS, mw_},
                                {DNNL_ARG_SCRATCHPAD, mscratch_}});
#if STEPBENCH_PLANT_FAULT == 1 || STEPBENCH_PLANT_FAULT == 2
    float* g = static_cast<float*>(dw);
    for (std::size_t i = 0, n = mw_.get_desc().get_size() / sizeof(float); i < n; ++i)
      g[i] = STEPBENCH_PLANT_FAULT == 1 ? 2 * g[i] : 0.0f;
#endif
  }

 private:
  static void point(memory& m, const void* p) { m.set_data_handle(const_cast<void*>(p)); }
  dnnl::stream& strm_;
  TensorDesc ydesc_, xdesc_;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd_;
  dnnl::convolution_backward_weights::primitive_desc bwd_filter_pd_;
  dnnl::primitive fwd_, bwd_data_, bwd_filter_;
  memory mx_, my_, mw_, mwf_, mscratch_;
  std::size_t scratch_ = 0;
};

// ---- fully connected -----------------------------------------------------------------------------
class DnnlLinear final : public LinearOp {
 public:
  DnnlLinear(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y)
      : strm_(strm), xdesc_(x) {
    require_dense_f32(x, "linear");
    require_dense_f32(y, "linear");
    SB_CHECK(x.shape.h == 1 && x.shape.w == 1 && y.shape.h == 1 && y.shape.w == 1 && x.shape.n == y.shape.n,
             "linear takes N x K x 1 x 1 inputs and N x M x 1 x 1 outputs");
    const memory::desc xd({x.shape.n, x.shape.c}, dt::f32, tag::nc), yd({y.shape.n, y.shape.c}, dt::f32, tag::nc);
    const memory::desc wd({y.shape.c, x.shape.c}, dt::f32, tag::oi), bd({y.shape.c}, dt::f32, tag::a);
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
    mscratch_ = memory(memory::desc({static_cast<memory::dim>(std::max<std::size_t>(scratch_, 1))}, dt::u8, tag::a),
                       eng, DNNL_MEMORY_NONE);
  }
  std::size_t workspace_bytes() const override { return align_up(scratch_) + xdesc_.bytes(); }
  void forward(Stream&, const Tensor& x, const void* w, const void* b, const Tensor& y, void* ws) override {
    point(mx_, x.data); point(mw_, w); point(mb_, b); point(my_, y.data); point(mscratch_, ws);
    fwd_.execute(strm_, {{DNNL_ARG_SRC, mx_}, {DNNL_ARG_WEIGHTS, mw_}, {DNNL_ARG_BIAS, mb_}, {DNNL_ARG_DST, my_},
                         {DNNL_ARG_SCRATCHPAD, mscratch_}});
  }
  void backward_data(Stream&, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    void* target = beta == 0.0f ? dx.data : static_cast<char*>(ws) + align_up(scratch_);
    point(my_, dy.data); point(mw_, w); point(mx_, target); point(mscratch_, ws);
    bwd_data_.execute(strm_, {{DNNL_ARG_DIFF_DST, my_}, {DNNL_ARG_WEIGHTS, mw_}, {DNNL_ARG_DIFF_SRC, mx_},
                              {DNNL_ARG_SCRATCHPAD, mscratch_}});
    if (beta != 0.0f) cpu::add(Tensor{target, xdesc_}, dx, beta);
  }
  void backward_weights(Stream&, const Tensor& x, const Tensor& dy, void* dw, void* db, void* ws) override {
    point(mx_, x.data); point(my_, dy.data); point(mw_, dw); point(mb_, db); point(mscratch_, ws);
    bwd_w_.execute(strm_, {{DNNL_ARG_SRC, mx_}, {DNNL_ARG_DIFF_DST, my_}, {DNNL_ARG_DIFF_WEIGHTS, mw_},
                           {DNNL_ARG_DIFF_BIAS, mb_}, {DNNL_ARG_SCRATCHPAD, mscratch_}});
  }

 private:
  static void point(memory& m, const void* p) { m.set_data_handle(const_cast<void*>(p)); }
  dnnl::stream& strm_;
  TensorDesc xdesc_;
  dnnl::inner_product_forward::primitive_desc fwd_pd_;
  dnnl::inner_product_backward_data::primitive_desc bwd_data_pd_;
  dnnl::inner_product_backward_weights::primitive_desc bwd_w_pd_;
  dnnl::primitive fwd_, bwd_data_, bwd_w_;
  memory mx_, my_, mw_, mb_, mscratch_;
  std::size_t scratch_ = 0;
};

// ---- ops on the hand-written kernels -------------------------------------------------------------
class CpuBatchNorm final : public BatchNormOp {
 public:
  CpuBatchNorm(const TensorDesc& x, const BatchNormParams& p) : p_(p), scratch_(cpu::bn_scratch_doubles(x.shape.c)) {
    if (x.dtype != DType::f32) throw UnsupportedError("batch norm: the cpu backend computes in fp32 only");
  }
  void forward_training(Stream&, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                        float* rm, float* rv, float* sm, float* si, void*, void*) override {
    cpu::bn_forward_training(x, y, gamma, beta, rm, rv, sm, si, p_, scratch_.data());
  }
  void forward_inference(Stream&, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                         const float* rm, const float* rv, void*) override {
    cpu::bn_forward_inference(x, y, gamma, beta, rm, rv, p_, scratch_.data());
  }
  void backward(Stream&, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* gamma,
                const float*, const float* sm, const float* si, float* dgamma, float* dbeta, float beta_dx, void*,
                const void*) override {
    cpu::bn_backward(x, y, dy, dx, gamma, sm, si, dgamma, dbeta, beta_dx, p_.relu, scratch_.data());
  }

 private:
  BatchNormParams p_;
  std::vector<double> scratch_;  // sized at planning time
};

class CpuPool final : public PoolOp {
 public:
  CpuPool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) : p_(p), y_(y) {
    if (x.dtype != DType::f32) throw UnsupportedError("pooling: the cpu backend computes in fp32 only");
    SB_CHECK(pool_output_shape(x.shape, p) == y.shape, "pool output shape mismatch");
  }
  std::size_t reserve_bytes() const override {
    return p_.kind == PoolKind::max ? static_cast<std::size_t>(y_.numel()) * sizeof(std::int32_t) : 0;
  }
  void forward(Stream&, const Tensor& x, const Tensor& y, void* reserve) override {
    cpu::pool_forward(x, y, p_, static_cast<std::int32_t*>(reserve));
  }
  void backward(Stream&, const Tensor&, const Tensor&, const Tensor& dy, const Tensor& dx, float beta,
                const void* reserve) override {
    cpu::pool_backward(dy, dx, p_, beta, static_cast<const std::int32_t*>(reserve));
  }

 private:
  PoolParams p_;
  TensorDesc y_;
};

class CpuRelu final : public ReluOp {
 public:
  void forward(Stream&, const Tensor& x, const Tensor& y) override { cpu::relu_forward(x, y); }
  void backward(Stream&, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta) override {
    cpu::relu_backward(y, dy, dx, beta);
  }
};

class CpuDropout final : public DropoutOp {
 public:
  CpuDropout(const TensorDesc& x, double p) : n_(static_cast<std::size_t>(x.numel())), p_(p) {
    if (!(p >= 0.0 && p < 1.0)) throw UsageError(fmt::format("dropout probability {} must be in [0, 1)", p));
  }
  std::size_t reserve_bytes() const override { return n_; }
  void forward(Stream&, const Tensor& x, const Tensor& y, void* reserve, std::uint64_t seed,
               std::uint64_t step) override {
    cpu::dropout_forward(x, y, static_cast<std::uint8_t*>(reserve), p_, seed, step);
  }
  void backward(Stream&, const Tensor& dy, const Tensor& dx, float beta, const void* reserve) override {
    cpu::dropout_backward(dy, dx, beta, static_cast<const std::uint8_t*>(reserve), p_);
  }

 private:
  std::size_t n_;
  double p_;
};

class CpuSoftmaxXent final : public SoftmaxCrossEntropyOp {
 public:
  explicit CpuSoftmaxXent(const TensorDesc& l) : n_(static_cast<std::size_t>(l.numel())) {}
  std::size_t reserve_bytes() const override { return n_ * sizeof(float); }
  void forward(Stream&, const Tensor& logits, const std::int32_t* labels, float* loss, void* reserve) override {
    cpu::softmax_xent_forward(logits, labels, loss, static_cast<float*>(reserve));
  }
  void backward(Stream&, const std::int32_t* labels, const Tensor& dlogits, float scale, float beta,
                const void* reserve, const float* loss_scale) override {
    cpu::softmax_xent_backward(labels, dlogits, loss_scale ? scale * *loss_scale : scale, beta,
                               static_cast<const float*>(reserve));
  }

 private:
  std::size_t n_;
};

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  return "unknown CPU";
}

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return fmt::format("isa#{}", static_cast<int>(isa));
  }
}

// ---- the backend ---------------------------------------------------------------------------------
class CpuBackend final : public Backend {
 public:
  CpuBackend() : eng_(dnnl::engine::kind::cpu, 0), strm_(eng_) {}

  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override { return "cpu"; }
  std::string device_name() const override {
    return fmt::format("{} ({} threads)", cpu_model_name(), omp_get_max_threads());
  }
  std::map<std::string, std::string> versions() const override {
    const auto* v = dnnl::version();
    return {{"onednn", fmt::format("{}.{}.{}", v->major, v->minor, v->patch)},
            {"cpu_isa", isa_name(dnnl::get_effective_cpu_isa())},
            {"omp_threads", std::to_string(omp_get_max_threads())}};
  }
  void require(DType t) const override {
    if (t == DType::f32) return;
    const std::string isa = isa_name(dnnl::get_effective_cpu_isa());
    if (t == DType::bf16 && !bf16_capable())
      throw UnsupportedError(fmt::format(
          "precision bf16 is not supported by the cpu backend on this CPU: oneDNN finds no bf16 convolution for "
          "ISA {} (it needs avx512_core or newer); use --precision fp32",
          isa));
    throw UnsupportedError(fmt::format("precision {} is not supported by the cpu backend (it computes in fp32); "
                                       "use --precision fp32, or the cuda backend for reduced precision",
                                       to_string(t)));
  }
  FilterFormat filter_format(Layout l) const override {
    // The layouts oneDNN's GEMM convolutions take without reordering (oihw: NCHW, hwio: NHWC).
    return l == Layout::nchw ? FilterFormat::oihw : FilterFormat::hwio;
  }

  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(64, align_up(std::max<std::size_t>(bytes, 1)));
    if (!p)
      throw Error(fmt::format("out of memory: could not allocate {:.1f} MiB of host memory; use a smaller batch",
                              static_cast<double>(bytes) / (1 << 20)));
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  void* allocate_host(std::size_t bytes) override { return allocate(bytes); }
  void deallocate_host(void* p) override { std::free(p); }
  std::size_t memory_available() const override {
    std::ifstream f("/proc/meminfo");
    std::string key;
    std::size_t kb = 0;
    std::string unit;
    while (f >> key >> kb >> unit)
      if (key == "MemAvailable:") return kb * 1024;
    return static_cast<std::size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  }

  Stream& default_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CpuStream>(); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }
  void record(Event& e, Stream&) override { static_cast<CpuEvent&>(e).t = std::chrono::steady_clock::now(); }
  void wait(Stream&, Event&) override {}
  void synchronize(Stream&) override {}
  double elapsed_ms(Event& a, Event& b) override {
    return std::chrono::duration<double, std::milli>(static_cast<CpuEvent&>(b).t - static_cast<CpuEvent&>(a).t)
        .count();
  }

  void copy(Stream&, void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void memset_zero(Stream&, void* dst, std::size_t bytes) override { std::memset(dst, 0, bytes); }
  void fill(Stream&, float* dst, float value, std::size_t count) override { cpu::fill(dst, value, count); }

  std::unique_ptr<ConvOp> make_conv(const TensorDesc& x, const TensorDesc& y, const ConvParams& p) override {
    return std::make_unique<DnnlConv>(eng_, strm_, x, y, p, filter_format(x.layout));
  }
  std::unique_ptr<BatchNormOp> make_batch_norm(const TensorDesc& x, const TensorDesc&,
                                               const BatchNormParams& p) override {
    return std::make_unique<CpuBatchNorm>(x, p);
  }
  std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) override {
    return std::make_unique<CpuPool>(x, y, p);
  }
  std::unique_ptr<ReluOp> make_relu(const TensorDesc& x, const TensorDesc&) override {
    if (x.dtype != DType::f32) throw UnsupportedError("relu: the cpu backend computes in fp32 only");
    return std::make_unique<CpuRelu>();
  }
  std::unique_ptr<LinearOp> make_linear(const TensorDesc& x, const TensorDesc& y) override {
    return std::make_unique<DnnlLinear>(eng_, strm_, x, y);
  }
  std::unique_ptr<DropoutOp> make_dropout(const TensorDesc& x, double p) override {
    return std::make_unique<CpuDropout>(x, p);
  }
  std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const TensorDesc& logits) override {
    return std::make_unique<CpuSoftmaxXent>(logits);
  }

  void add(Stream&, const Tensor& src, const Tensor& dst, float beta) override { cpu::add(src, dst, beta); }
  void scale(Stream&, float* x, float alpha, std::size_t count) override { cpu::scale(x, alpha, count); }
  void optimizer_update(Stream&, const OptimizerConfig& cfg, float* params, const float* grads, float* s0, float* s1,
                        std::size_t count, const float* scaler) override {
    if (scaler && scaler[1] != 0.0f) return;  // an overflow this step: skip it (the scale shrinks)
    cpu::optimizer_update(cfg, params, grads, s0, s1, count, scaler ? 1.0f / scaler[0] : 1.0f);
  }
  void cast(Stream&, const void* src, DType from, void* dst, DType to, std::size_t count) override {
    const auto n = static_cast<std::int64_t>(count);
    const std::int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; i += chunk)
      convert(static_cast<const char*>(src) + static_cast<std::size_t>(i) * dtype_size(from), from,
              static_cast<char*>(dst) + static_cast<std::size_t>(i) * dtype_size(to), to,
              static_cast<std::size_t>(std::min(chunk, n - i)));
  }
  void check_finite(Stream&, const float* x, std::size_t count, float* scaler) override {
    bool bad = false;
#pragma omp parallel for reduction(|| : bad) schedule(static)
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(count); ++i) bad = bad || !std::isfinite(x[i]);
    if (bad) scaler[1] = 1.0f;
  }
  void update_loss_scale(Stream&, float* scaler, int growth_interval) override {
    if (scaler[1] != 0.0f) {
      scaler[0] *= 0.5f;
      scaler[2] = 0.0f;
    } else if (++scaler[2] >= static_cast<float>(growth_interval)) {
      scaler[0] *= 2.0f;
      scaler[2] = 0.0f;
    }
    scaler[1] = 0.0f;
  }

 private:
  bool bf16_capable() const {
    try {
      const memory::desc xd({1, 16, 8, 8}, dt::bf16, tag::nhwc), wd({16, 16, 3, 3}, dt::bf16, tag::any);
      dnnl::convolution_forward::primitive_desc pd(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                          xd, wd, memory::desc({1, 16, 6, 6}, dt::bf16, tag::nhwc), {1, 1}, {0, 0},
                                          {0, 0}),
          eng_);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }
  mutable dnnl::engine eng_;
  dnnl::stream strm_;
  CpuStream stream_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace stepbench
