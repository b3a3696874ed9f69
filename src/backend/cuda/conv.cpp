// Convolution on cuDNN: cudnnFind* at planning time picks each direction's fastest algorithm within
// the workspace budget (--workspace-mb), once per process and key (the plan cache, Ctx::plans; kept
// between runs with --plan-cache FILE); strided descriptors, so x and y may be concat slices.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/common.hpp"
#include "backend/cuda/conv_padding.hpp"

namespace stepbench::cuda {
namespace {

// A filter descriptor in the data's layout: OIHW for NCHW, OHWI for NHWC.
FilterDescriptor filter_descriptor(std::int64_t k, std::int64_t c, int kh, int kw, Layout l, DType t) {
  cudnnFilterDescriptor_t h = nullptr;
  SB_CUDNN(cudnnCreateFilterDescriptor(&h));
  FilterDescriptor d(h);
  SB_CUDNN(cudnnSetFilter4dDescriptor(d.get(), cudnn_type(t), l == Layout::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                      static_cast<int>(k), static_cast<int>(c), kh, kw));
  return d;
}

// A convolution descriptor and its math type: one per direction, each taking the math type its
// algorithm was timed with.
struct ConvDescriptor {
  ConvolutionDescriptor d;
  bool fma = false;
  ConvDescriptor(const ConvParams& p, bool tf32, DType t) {
    cudnnConvolutionDescriptor_t h = nullptr;
    SB_CUDNN(cudnnCreateConvolutionDescriptor(&h));
    d = ConvolutionDescriptor(h);
    // fp32 accumulation for every storage type (bf16/fp16 data, fp32 compute: what autocast does)
    SB_CUDNN(cudnnSetConvolution2dDescriptor(d.get(), p.pad_h, p.pad_w, p.stride_h, p.stride_w, 1, 1,
                                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    if (p.groups > 1) SB_CUDNN(cudnnSetConvolutionGroupCount(d.get(), p.groups));  // the filter is O x I/G x KH x KW
    // FMA math keeps fp32 exact (no TF32 tensor cores); TENSOR_OP math allows TF32, and is what
    // 16-bit data runs on.
    fma = !tf32 && t == DType::f32;
    SB_CUDNN(cudnnSetConvolutionMathType(d.get(), fma ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  }
};

// The fastest algorithm cudnnFind* returned (it sorts them) that fits the workspace budget, as a plan.
template <class Perf>
ConvPlan fastest(const Perf* p, int n, const char* what, std::size_t budget) {
  for (int i = 0; i < n; ++i)
    if (p[i].status == CUDNN_STATUS_SUCCESS && p[i].memory <= budget)
      return ConvPlan{static_cast<int>(p[i].algo), static_cast<int>(p[i].mathType), p[i].memory,
                      static_cast<double>(p[i].time)};
  throw Error(
      fmt::format("cuDNN found no {} convolution algorithm within the {} MiB workspace budget "
                  "(--workspace-mb)",
                  what, budget >> 20));
}

// A zeroed device allocation owned by an op (made at planning time, never in a step).
DeviceBuffer zeroed_device_buffer(int device, std::size_t bytes) {
  SB_CUDA(cudaSetDevice(device));
  void* p = nullptr;
  SB_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)));
  DeviceBuffer b(p);
  SB_CUDA(cudaMemset(p, 0, std::max<std::size_t>(bytes, 1)));  // padding channels stay zero
  // the legacy stream is not ordered with the ops' non-blocking streams: finish here, at planning
  SB_CUDA(cudaDeviceSynchronize());
  return b;
}

// An OHWI filter as a 4-D view: n = O, c = I, h = KH, w = KW.
View filter_view(void* p, long long o, long long i, long long kh, long long kw, long long i_stored, DType t) {
  return View{p, o, i, kh, kw, kh * kw * i_stored, 1, kw * i_stored, i_stored, elem(t)};
}

class CudnnConv final : public ConvOp {
 public:
  CudnnConv(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const ConvParams& p)
      : c_(c),
        x_(x),
        xp_(channel_padded(x, p.groups)),
        p_(p),
        cout_(y.shape.c),
        xd_(tensor_descriptor(xp_)),
        yd_(tensor_descriptor(y)),
        wd_(filter_descriptor(y.shape.c, xp_.shape.c / p.groups, p.kh, p.kw, x.layout, x.dtype)),
        fwd_cd_(p, c.tf32, x.dtype),
        data_cd_(p, c.tf32, x.dtype),
        filter_cd_(p, c.tf32, x.dtype) {
    SB_CHECK(conv_output_shape(x.shape, y.shape.c, p) == y.shape, "convolution output shape mismatch");
    SB_CUDA(cudaSetDevice(c_.device));
    if (c_.sizing_only) {  // never run: the most workspace a searched plan may take, no padded copies
      fwd_ws_ = data_ws_ = filter_ws_ = c_.workspace_budget;
      return;
    }
    if (padded()) {
      const std::size_t wbytes = static_cast<std::size_t>(cout_ * p.kh * p.kw * xp_.shape.c) * dtype_size(x.dtype);
      xpad_ = zeroed_device_buffer(c_.device, xp_.bytes());
      dxpad_ = zeroed_device_buffer(c_.device, xp_.bytes());
      wpad_ = zeroed_device_buffer(c_.device, wbytes);
      dwpad_ = zeroed_device_buffer(c_.device, wbytes);
    }
    // Each direction runs the plan the cache holds for its key, or the one cudnnFind picks now (then
    // recorded for every other tower and the per-layer benchmarks), with the math type Find timed it
    // with (one algorithm may be listed once per math type, with other kernels and workspaces).
    fwd_ = static_cast<cudnnConvolutionFwdAlgo_t>(plan(ConvDirection::forward, y, fwd_cd_, fwd_ws_, [&] {
      int n = 0;
      cudnnConvolutionFwdAlgoPerf_t f[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      SB_CUDNN(cudnnFindConvolutionForwardAlgorithm(c_.cudnn, xd_.get(), wd_.get(), fwd_cd_.d.get(), yd_.get(),
                                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, f));
      return fastest(f, n, "forward", c_.workspace_budget);
    }));
    bwd_data_ =
        static_cast<cudnnConvolutionBwdDataAlgo_t>(plan(ConvDirection::backward_data, y, data_cd_, data_ws_, [&] {
          int n = 0;
          cudnnConvolutionBwdDataAlgoPerf_t d[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
          SB_CUDNN(cudnnFindConvolutionBackwardDataAlgorithm(c_.cudnn, wd_.get(), yd_.get(), data_cd_.d.get(),
                                                             xd_.get(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, d));
          return fastest(d, n, "backward data", c_.workspace_budget);
        }));
    bwd_filter_ = static_cast<cudnnConvolutionBwdFilterAlgo_t>(
        plan(ConvDirection::backward_filter, y, filter_cd_, filter_ws_, [&] {
          int n = 0;
          cudnnConvolutionBwdFilterAlgoPerf_t w[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
          SB_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithm(c_.cudnn, xd_.get(), yd_.get(), filter_cd_.d.get(),
                                                               wd_.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n,
                                                               w));
          return fastest(w, n, "backward filter", c_.workspace_budget);
        }));
  }
  std::size_t workspace_bytes() const override { return std::max({fwd_ws_, data_ws_, filter_ws_}); }
  std::string algorithm() const override {
    if (c_.sizing_only) return "not searched (sized at the workspace budget)";
    return fmt::format("cudnn fwd algo {} / bwd_data algo {} / bwd_filter algo {}{}", static_cast<int>(fwd_),
                       static_cast<int>(bwd_data_), static_cast<int>(bwd_filter_),
                       padded() ? fmt::format(" (channels padded {} -> {})", x_.shape.c, xp_.shape.c) : "");
  }
  void forward(Stream& s, const Tensor& x, const void* w, const Tensor& y, void* ws) override {
    const float a = 1, b = 0;
    set(s);
    const void* xin = x.data;
    if (padded()) {
      xin = pad_input(s, x);
      w = pad_filter(s, w);
    }
    SB_CUDNN(cudnnConvolutionForward(c_.cudnn, &a, xd_.get(), xin, wd_.get(), w, fwd_cd_.d.get(), fwd_, ws, fwd_ws_, &b,
                                     yd_.get(), y.data));
  }
  void backward_data(Stream& s, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    const float a = 1, zero = 0;
    set(s);
    if (!padded()) {
      SB_CUDNN(cudnnConvolutionBackwardData(c_.cudnn, &a, wd_.get(), w, yd_.get(), dy.data, data_cd_.d.get(), bwd_data_,
                                            ws, data_ws_, &beta, xd_.get(), dx.data));
      return;
    }
    SB_CUDNN(cudnnConvolutionBackwardData(c_.cudnn, &a, wd_.get(), pad_filter(s, w), yd_.get(), dy.data,
                                          data_cd_.d.get(), bwd_data_, ws, data_ws_, &zero, xd_.get(), dxpad_.get()));
    const Tensor dxp{dxpad_.get(), xp_};
    SB_CUDA(cuda::launch_add(view(dxp.channel_slice(0, x_.shape.c)), view(dx), beta, S(s)));
  }
  void backward_filter(Stream& s, const Tensor& x, const Tensor& dy, void* dw, void* ws) override {
    const float a = 1, b = 0;
    set(s);
    const void* xin = padded() ? pad_input(s, x) : x.data;
    SB_CUDNN(cudnnConvolutionBackwardFilter(c_.cudnn, &a, xd_.get(), xin, yd_.get(), dy.data, filter_cd_.d.get(),
                                            bwd_filter_, ws, filter_ws_, &b, wd_.get(), padded() ? dwpad_.get() : dw));
    if (padded())
      SB_CUDA(cuda::launch_add(filter_view(dwpad_.get(), cout_, x_.shape.c, p_.kh, p_.kw, xp_.shape.c, x_.dtype),
                               filter_view(dw, cout_, x_.shape.c, p_.kh, p_.kw, x_.shape.c, x_.dtype), 0.0f, S(s)));
  }

 private:
  bool padded() const { return xp_.shape.c != x_.shape.c; }
  // The plan of one direction: from the cache, or searched (search()) and recorded there. The
  // descriptor takes the plan's math type (plain fp32 stays on FMA math: DEFAULT_MATH would allow
  // TF32 on Ampere and later) and ws the workspace the algorithm needs with it.
  template <class Search>
  ConvPlan searched(Search search) const {
    try {
      return search();
    } catch (const Error& e) {  // which convolution: planning has many
      throw Error(fmt::format("{} (convolution {} {} {}{} -> {} channels, kernel {}x{} stride {}x{} pad {}x{})",
                              e.what(), to_string(x_.layout), to_string(x_.dtype), to_string(x_.shape),
                              xp_.shape.c != x_.shape.c ? " (channels padded)" : "", cout_, p_.kh, p_.kw, p_.stride_h,
                              p_.stride_w, p_.pad_h, p_.pad_w));
    }
  }
  template <class Search>
  int plan(ConvDirection d, const TensorDesc& y, ConvDescriptor& cd, std::size_t& ws, Search search) {
    const std::string key = conv_plan_key(c_.machine, d, xp_, y, p_, cd.fma ? "fma" : "tensor_op", c_.workspace_budget);
    if (const auto hit = c_.plans->find(key)) {
      // a plan from a file that does not run here (a damaged or hand-edited entry): searched again
      try {
        if (apply(d, cd, *hit, ws)) return hit->algo;
      } catch (const Error&) {
      }
      const ConvPlan pl = searched(search);
      c_.plans->replace(key, pl);
      return applied(d, cd, pl, ws);
    }
    return applied(d, cd, c_.plans->insert(key, searched(search)), ws);
  }
  int applied(ConvDirection d, ConvDescriptor& cd, const ConvPlan& pl, std::size_t& ws) {
    if (!apply(d, cd, pl, ws))
      throw Error(
          fmt::format("cuDNN's {} algorithm {} needs {} bytes of workspace, over the {} MiB budget "
                      "(--workspace-mb), though cudnnFind listed it within",
                      to_string(d), pl.algo, ws, c_.workspace_budget >> 20));
    return pl.algo;
  }
  // The descriptor takes the plan's math type, ws the larger of the workspace cuDNN reports for the
  // algorithm with it and the one Find timed; false when that is over the budget. Throws when cuDNN
  // refuses the plan.
  bool apply(ConvDirection d, ConvDescriptor& cd, const ConvPlan& pl, std::size_t& ws) {
    if (!cd.fma) SB_CUDNN(cudnnSetConvolutionMathType(cd.d.get(), static_cast<cudnnMathType_t>(pl.math)));
    switch (d) {
      case ConvDirection::forward:
        SB_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(c_.cudnn, xd_.get(), wd_.get(), cd.d.get(), yd_.get(),
                                                         static_cast<cudnnConvolutionFwdAlgo_t>(pl.algo), &ws));
        break;
      case ConvDirection::backward_data:
        SB_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(c_.cudnn, wd_.get(), yd_.get(), cd.d.get(), xd_.get(),
                                                              static_cast<cudnnConvolutionBwdDataAlgo_t>(pl.algo),
                                                              &ws));
        break;
      case ConvDirection::backward_filter:
        SB_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(c_.cudnn, xd_.get(), yd_.get(), cd.d.get(), wd_.get(),
                                                                static_cast<cudnnConvolutionBwdFilterAlgo_t>(pl.algo),
                                                                &ws));
        break;
    }
    ws = std::max(ws, pl.workspace);
    return ws <= c_.workspace_budget;
  }
  const void* pad_input(Stream& s, const Tensor& x) {
    const Tensor xp{xpad_.get(), xp_};
    SB_CUDA(cuda::launch_add(view(x), view(xp.channel_slice(0, x_.shape.c)), 0.0f, S(s)));
    return xpad_.get();
  }
  const void* pad_filter(Stream& s, const void* w) {
    SB_CUDA(cuda::launch_add(filter_view(const_cast<void*>(w), cout_, x_.shape.c, p_.kh, p_.kw, x_.shape.c, x_.dtype),
                             filter_view(wpad_.get(), cout_, x_.shape.c, p_.kh, p_.kw, xp_.shape.c, x_.dtype), 0.0f,
                             S(s)));
    return wpad_.get();
  }
  void set(Stream& s) {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDNN(cudnnSetStream(c_.cudnn, S(s)));
  }
  Ctx c_;
  TensorDesc x_, xp_;  // the input as given, and as cuDNN sees it (channel-padded or the same)
  ConvParams p_;
  long long cout_;
  TensorDescriptor xd_, yd_;
  FilterDescriptor wd_;
  ConvDescriptor fwd_cd_, data_cd_, filter_cd_;
  DeviceBuffer xpad_, dxpad_, wpad_, dwpad_;
  cudnnConvolutionFwdAlgo_t fwd_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_{};
  std::size_t fwd_ws_ = 0, data_ws_ = 0, filter_ws_ = 0;
};

}  // namespace

std::unique_ptr<ConvOp> make_cuda_conv(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const ConvParams& p) {
  return std::make_unique<CudnnConv>(c, x, y, p);
}

}  // namespace stepbench::cuda
