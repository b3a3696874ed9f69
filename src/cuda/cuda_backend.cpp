// The CUDA backend: convolutions on cuDNN (cudnnFind* at planning time within a workspace budget),
// batch norm (ReLU fused where cuDNN can) and pooling on cuDNN, the fully connected layer on
// cuBLAS, and stepbench's own kernels (src/cuda/kernels.cu) for ReLU, accumulation, dropout, the
// loss and the optimizer update, and for batch norm and pooling where cuDNN declines a layout.
// fp32, bf16 or fp16 storage (fp32 accumulation everywhere); TF32 tensor-op math on request
// (set_tensor_math). Every tensor may be a strided view (a concat slice): cuDNN gets strided
// descriptors, the kernels take strides.
//
// Written and compiled without a GPU (the session that wrote it had none): the op and model tests
// run it against the oracle wherever a GPU is visible.
#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "stepbench/backend.hpp"

#define SB_CUDNN(call)                                                                                      \
  do {                                                                                                      \
    cudnnStatus_t sb_st_ = (call);                                                                          \
    if (sb_st_ != CUDNN_STATUS_SUCCESS)                                                                     \
      ::stepbench::throw_error(__FILE__, __LINE__,                                                          \
                               fmt::format("{} failed: {}", #call, cudnnGetErrorString(sb_st_)));           \
  } while (0)

#define SB_CUBLAS(call)                                                                                     \
  do {                                                                                                      \
    cublasStatus_t sb_st_ = (call);                                                                         \
    if (sb_st_ != CUBLAS_STATUS_SUCCESS)                                                                    \
      ::stepbench::throw_error(__FILE__, __LINE__,                                                          \
                               fmt::format("{} failed: {}", #call, cublasGetStatusString(sb_st_)));         \
  } while (0)

namespace stepbench {

int cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::string cuda_unavailable_reason_impl() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess)
    return fmt::format("no GPU visible ({}: {})", cudaGetErrorName(err), cudaGetErrorString(err));
  if (n == 0) return "no GPU visible (0 CUDA devices)";
  return "";
}

namespace {

using cuda::View;

struct CudaStream final : Stream {
  cudaStream_t s = nullptr;
  explicit CudaStream(int device) {
    SB_CUDA(cudaSetDevice(device));
    SB_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  ~CudaStream() override { cudaStreamDestroy(s); }
  void* native_handle() override { return s; }
};
struct CudaEvent final : Event {
  cudaEvent_t e = nullptr;
  explicit CudaEvent(int device) {
    SB_CUDA(cudaSetDevice(device));
    SB_CUDA(cudaEventCreate(&e));
  }
  ~CudaEvent() override { cudaEventDestroy(e); }
};
cudaStream_t S(Stream& s) { return static_cast<CudaStream&>(s).s; }

struct CudaGraphWork final : CapturedWork {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  int device;
  CudaGraphWork(cudaGraph_t g, int dev) : graph(g), device(dev) {
    SB_CUDA(cudaSetDevice(device));
    SB_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  }
  ~CudaGraphWork() override {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  void replay(Stream& s) override {
    SB_CUDA(cudaSetDevice(device));
    SB_CUDA(cudaGraphLaunch(exec, S(s)));
  }
};

int elem(DType t) { return t == DType::f32 ? cuda::kF32 : t == DType::bf16 ? cuda::kBF16 : cuda::kF16; }
cudnnDataType_t cudnn_type(DType t) {
  return t == DType::f32 ? CUDNN_DATA_FLOAT : t == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}
cudaDataType_t cuda_type(DType t) { return t == DType::f32 ? CUDA_R_32F : t == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F; }

View view(const Tensor& t) {
  const auto& d = t.desc;
  return View{t.data, d.shape.n, d.shape.c, d.shape.h, d.shape.w, d.strides.n, d.strides.c, d.strides.h, d.strides.w,
              elem(d.dtype)};
}
cuda::Flat flat(const void* p, DType t) { return cuda::Flat{const_cast<void*>(p), elem(t)}; }

// ---- RAII descriptors -------------------------------------------------------------------------------
struct TensorDescriptor {
  cudnnTensorDescriptor_t d = nullptr;
  explicit TensorDescriptor(const TensorDesc& t) {
    SB_CUDNN(cudnnCreateTensorDescriptor(&d));
    SB_CUDNN(cudnnSetTensor4dDescriptorEx(d, cudnn_type(t.dtype), static_cast<int>(t.shape.n), static_cast<int>(t.shape.c),
                                          static_cast<int>(t.shape.h), static_cast<int>(t.shape.w),
                                          static_cast<int>(t.strides.n), static_cast<int>(t.strides.c),
                                          static_cast<int>(t.strides.h), static_cast<int>(t.strides.w)));
  }
  ~TensorDescriptor() { cudnnDestroyTensorDescriptor(d); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
};
struct FilterDescriptor {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDescriptor(std::int64_t k, std::int64_t c, int kh, int kw, Layout l, DType t) {
    SB_CUDNN(cudnnCreateFilterDescriptor(&d));
    SB_CUDNN(cudnnSetFilter4dDescriptor(d, cudnn_type(t), l == Layout::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                        static_cast<int>(k), static_cast<int>(c), kh, kw));
  }
  ~FilterDescriptor() { cudnnDestroyFilterDescriptor(d); }
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
};
struct ConvDescriptor {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDescriptor(const ConvParams& p, bool tf32, DType t) {
    SB_CUDNN(cudnnCreateConvolutionDescriptor(&d));
    // fp32 accumulation for every storage type (bf16/fp16 data, fp32 compute: what autocast does)
    SB_CUDNN(cudnnSetConvolution2dDescriptor(d, p.pad_h, p.pad_w, p.stride_h, p.stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                             CUDNN_DATA_FLOAT));
    // FMA math keeps fp32 exact (no TF32 tensor cores); TENSOR_OP math allows TF32, and is what
    // 16-bit data runs on.
    fma = !tf32 && t == DType::f32;
    SB_CUDNN(cudnnSetConvolutionMathType(d, fma ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  }
  bool fma = false;
  ~ConvDescriptor() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDescriptor(const ConvDescriptor&) = delete;
  ConvDescriptor& operator=(const ConvDescriptor&) = delete;
};

// The fastest algorithm cudnnFind* returned (it sorts them) that fits the workspace budget; the
// descriptor takes the math type it was timed with.
template <class Perf>
decltype(Perf{}.algo) pick(const Perf* p, int n, const char* what, std::size_t budget, std::size_t& ws,
                           ConvDescriptor& cd) {
  for (int i = 0; i < n; ++i)
    if (p[i].status == CUDNN_STATUS_SUCCESS && p[i].memory <= budget) {
      ws = p[i].memory;
      // plain fp32 stays on FMA math: DEFAULT_MATH would allow TF32 on Ampere and later
      if (!cd.fma) SB_CUDNN(cudnnSetConvolutionMathType(cd.d, p[i].mathType));
      return p[i].algo;
    }
  throw Error(fmt::format("cuDNN found no {} convolution algorithm within the {} MiB workspace budget "
                          "(--workspace-mb)",
                          what, budget >> 20));
}

struct Ctx {  // what every op of one backend shares
  int device;
  cudnnHandle_t cudnn;
  cublasHandle_t cublas;
  bool tf32;
  std::size_t workspace_budget;
  bool own_norm_pool;  // STEPBENCH_CUDA_OWN_KERNELS=1: batch norm and pooling on our kernels, not cuDNN
};

// ---- convolution -----------------------------------------------------------------------------------

// A device allocation owned by an op (made at planning time, never in a step).
struct DeviceMem {
  void* p = nullptr;
  DeviceMem() = default;
  DeviceMem(int device, std::size_t bytes) {
    SB_CUDA(cudaSetDevice(device));
    SB_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)));
    SB_CUDA(cudaMemset(p, 0, std::max<std::size_t>(bytes, 1)));  // padding channels stay zero
    // the legacy stream is not ordered with the ops' non-blocking streams: finish here, at planning
    SB_CUDA(cudaDeviceSynchronize());
  }
  DeviceMem(DeviceMem&& o) noexcept : p(std::exchange(o.p, nullptr)) {}
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(p, o.p);
    return *this;
  }
  ~DeviceMem() {
    if (p) cudaFree(p);
  }
};

// Tensor cores want the channel count of 16-bit NHWC data a multiple of 8; the 3-channel stem is
// padded with zero channels: the input (and its gradient) and the filter (and its gradient) get
// padded copies, and cuDNN runs on those.
bool needs_channel_pad(const TensorDesc& x) { return x.dtype != DType::f32 && x.layout == Layout::nhwc && x.shape.c % 8 != 0; }
TensorDesc channel_padded(const TensorDesc& x) {
  if (!needs_channel_pad(x)) return x;
  Shape s = x.shape;
  s.c = (s.c + 7) / 8 * 8;
  return TensorDesc::dense(s, x.dtype, x.layout);
}
// An OHWI filter as a 4-D view: n = O, c = I, h = KH, w = KW.
View filter_view(void* p, long long o, long long i, long long kh, long long kw, long long i_stored, DType t) {
  return View{p, o, i, kh, kw, kh * kw * i_stored, 1, kw * i_stored, i_stored, elem(t)};
}

class CudnnConv final : public ConvOp {
 public:
  CudnnConv(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const ConvParams& p)
      : c_(c), x_(x), xp_(channel_padded(x)), p_(p), cout_(y.shape.c), xd_(xp_), yd_(y),
        wd_(y.shape.c, xp_.shape.c, p.kh, p.kw, x.layout, x.dtype), fwd_cd_(p, c.tf32, x.dtype),
        data_cd_(p, c.tf32, x.dtype), filter_cd_(p, c.tf32, x.dtype) {
    SB_CHECK(conv_output_shape(x.shape, y.shape.c, p) == y.shape, "convolution output shape mismatch");
    SB_CUDA(cudaSetDevice(c_.device));
    if (padded()) {
      const std::size_t wbytes = static_cast<std::size_t>(cout_ * p.kh * p.kw * xp_.shape.c) * dtype_size(x.dtype);
      xpad_ = DeviceMem(c_.device, xp_.bytes());
      dxpad_ = DeviceMem(c_.device, xp_.bytes());
      wpad_ = DeviceMem(c_.device, wbytes);
      dwpad_ = DeviceMem(c_.device, wbytes);
    }
    // Each direction runs with the math type cudnnFind timed its algorithm with (one algorithm may
    // be listed once per math type, with different workspaces and kernels).
    int n = 0;
    cudnnConvolutionFwdAlgoPerf_t f[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    SB_CUDNN(cudnnFindConvolutionForwardAlgorithm(c_.cudnn, xd_.d, wd_.d, fwd_cd_.d, yd_.d,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, f));
    fwd_ = pick(f, n, "forward", c_.workspace_budget, fwd_ws_, fwd_cd_);
    cudnnConvolutionBwdDataAlgoPerf_t d[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    SB_CUDNN(cudnnFindConvolutionBackwardDataAlgorithm(c_.cudnn, wd_.d, yd_.d, data_cd_.d, xd_.d,
                                                       CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, d));
    bwd_data_ = pick(d, n, "backward data", c_.workspace_budget, data_ws_, data_cd_);
    cudnnConvolutionBwdFilterAlgoPerf_t w[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    SB_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithm(c_.cudnn, xd_.d, yd_.d, filter_cd_.d, wd_.d,
                                                         CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, w));
    bwd_filter_ = pick(w, n, "backward filter", c_.workspace_budget, filter_ws_, filter_cd_);
  }
  std::size_t workspace_bytes() const override { return std::max({fwd_ws_, data_ws_, filter_ws_}); }
  std::string algorithm() const override {
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
    SB_CUDNN(cudnnConvolutionForward(c_.cudnn, &a, xd_.d, xin, wd_.d, w, fwd_cd_.d, fwd_, ws, fwd_ws_, &b, yd_.d,
                                     y.data));
  }
  void backward_data(Stream& s, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    const float a = 1, zero = 0;
    set(s);
    if (!padded()) {
      SB_CUDNN(cudnnConvolutionBackwardData(c_.cudnn, &a, wd_.d, w, yd_.d, dy.data, data_cd_.d, bwd_data_, ws, data_ws_,
                                            &beta, xd_.d, dx.data));
      return;
    }
    SB_CUDNN(cudnnConvolutionBackwardData(c_.cudnn, &a, wd_.d, pad_filter(s, w), yd_.d, dy.data, data_cd_.d, bwd_data_, ws,
                                          data_ws_, &zero, xd_.d, dxpad_.p));
    const Tensor dxp{dxpad_.p, xp_};
    SB_CUDA(cuda::launch_add(view(dxp.channel_slice(0, x_.shape.c)), view(dx), beta, S(s)));
  }
  void backward_filter(Stream& s, const Tensor& x, const Tensor& dy, void* dw, void* ws) override {
    const float a = 1, b = 0;
    set(s);
    const void* xin = padded() ? pad_input(s, x) : x.data;
    SB_CUDNN(cudnnConvolutionBackwardFilter(c_.cudnn, &a, xd_.d, xin, yd_.d, dy.data, filter_cd_.d, bwd_filter_, ws,
                                            filter_ws_, &b, wd_.d, padded() ? dwpad_.p : dw));
    if (padded())
      SB_CUDA(cuda::launch_add(filter_view(dwpad_.p, cout_, x_.shape.c, p_.kh, p_.kw, xp_.shape.c, x_.dtype),
                               filter_view(dw, cout_, x_.shape.c, p_.kh, p_.kw, x_.shape.c, x_.dtype), 0.0f, S(s)));
  }

 private:
  bool padded() const { return xp_.shape.c != x_.shape.c; }
  const void* pad_input(Stream& s, const Tensor& x) {
    const Tensor xp{xpad_.p, xp_};
    SB_CUDA(cuda::launch_add(view(x), view(xp.channel_slice(0, x_.shape.c)), 0.0f, S(s)));
    return xpad_.p;
  }
  const void* pad_filter(Stream& s, const void* w) {
    SB_CUDA(cuda::launch_add(filter_view(const_cast<void*>(w), cout_, x_.shape.c, p_.kh, p_.kw, x_.shape.c, x_.dtype),
                             filter_view(wpad_.p, cout_, x_.shape.c, p_.kh, p_.kw, xp_.shape.c, x_.dtype), 0.0f,
                             S(s)));
    return wpad_.p;
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
  DeviceMem xpad_, dxpad_, wpad_, dwpad_;
  cudnnConvolutionFwdAlgo_t fwd_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_{};
  std::size_t fwd_ws_ = 0, data_ws_ = 0, filter_ws_ = 0;
};

// ---- fully connected (cuBLAS, column-major views of the row-major PyTorch layout) --------------------
class CublasLinear final : public LinearOp {
 public:
  CublasLinear(const Ctx& c, const TensorDesc& x, const TensorDesc& y)
      : c_(c), N_(static_cast<int>(x.shape.n)), K_(static_cast<int>(x.shape.c)), M_(static_cast<int>(y.shape.c)),
        t_(x.dtype) {
    SB_CHECK(x.shape.h == 1 && x.shape.w == 1 && y.shape.h == 1 && y.shape.w == 1, "linear takes N x C x 1 x 1");
    SB_CHECK(x.is_dense() && y.is_dense(), "linear takes dense tensors");
  }
  std::size_t workspace_bytes() const override { return 0; }
  // y^T (M x N) = W (as K x M col-major, transposed) * x^T (K x N)
  void forward(Stream& s, const Tensor& x, const void* w, const void* b, const Tensor& y, void*) override {
    const float a = 1, z = 0;
    set(s);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, M_, N_, K_, &a, w, K_, x.data, K_, &z, y.data, M_);
    SB_CUDA(cuda::launch_add_bias(flat(y.data, t_), flat(b, t_), N_, M_, S(s)));
  }
  // dx^T (K x N) = W^T (K x M) * dy^T (M x N)
  void backward_data(Stream& s, const Tensor& dy, const void* w, const Tensor& dx, float beta, void*) override {
    const float a = 1;
    set(s);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, K_, N_, M_, &a, w, K_, dy.data, M_, &beta, dx.data, K_);
  }
  // dW^T (K x M) = x^T (K x N) * dy (N x M); db = column sums of dy
  void backward_weights(Stream& s, const Tensor& x, const Tensor& dy, void* dw, void* db, void*) override {
    const float a = 1, z = 0;
    set(s);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, K_, M_, N_, &a, x.data, K_, dy.data, M_, &z, dw, K_);
    SB_CUDA(cuda::launch_bias_grad(flat(dy.data, t_), flat(db, t_), N_, M_, S(s)));
  }

 private:
  void set(Stream& s) {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUBLAS(cublasSetStream(c_.cublas, S(s)));
  }
  // Every storage type through cublasGemmEx with fp32 accumulation (the handle's math mode decides
  // TF32 for fp32 data).
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha, const void* A,
            int lda, const void* B, int ldb, const float* beta, void* C, int ldc) {
    const cudaDataType_t t = cuda_type(t_);
    SB_CUBLAS(cublasGemmEx(c_.cublas, ta, tb, m, n, k, alpha, A, t, lda, B, t, ldb, beta, C, t, ldc,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  Ctx c_;
  int N_, K_, M_;
  DType t_;
};

// ---- batch norm and pooling (cuDNN; stepbench's kernels where cuDNN declines) ------------------------
struct ActivationDescriptor {
  cudnnActivationDescriptor_t d = nullptr;
  ActivationDescriptor() {
    SB_CUDNN(cudnnCreateActivationDescriptor(&d));
    SB_CUDNN(cudnnSetActivationDescriptor(d, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  }
  ~ActivationDescriptor() { cudnnDestroyActivationDescriptor(d); }
  ActivationDescriptor(const ActivationDescriptor&) = delete;
  ActivationDescriptor& operator=(const ActivationDescriptor&) = delete;
};
// The 1 x C x 1 x 1 fp32 descriptor of BN's scale, bias, mean and variance (fp32 whatever x is).
struct BnParamDescriptor {
  cudnnTensorDescriptor_t d = nullptr;
  explicit BnParamDescriptor(cudnnTensorDescriptor_t x) {
    SB_CUDNN(cudnnCreateTensorDescriptor(&d));
    SB_CUDNN(cudnnDeriveBNTensorDescriptor(d, x, CUDNN_BATCHNORM_SPATIAL));
  }
  ~BnParamDescriptor() { cudnnDestroyTensorDescriptor(d); }
  BnParamDescriptor(const BnParamDescriptor&) = delete;
  BnParamDescriptor& operator=(const BnParamDescriptor&) = delete;
};
struct PoolingDescriptor {
  cudnnPoolingDescriptor_t d = nullptr;
  explicit PoolingDescriptor(const PoolParams& p) {
    SB_CUDNN(cudnnCreatePoolingDescriptor(&d));
    // max: the deterministic variant (the gradient goes to one maximum, the same every run)
    const cudnnPoolingMode_t m = p.kind == PoolKind::max               ? CUDNN_POOLING_MAX_DETERMINISTIC
                                 : p.kind == PoolKind::avg_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                                       : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    SB_CUDNN(cudnnSetPooling2dDescriptor(d, m, CUDNN_PROPAGATE_NAN, p.kh, p.kw, p.pad_h, p.pad_w, p.stride_h,
                                         p.stride_w));
  }
  ~PoolingDescriptor() { cudnnDestroyPoolingDescriptor(d); }
  PoolingDescriptor(const PoolingDescriptor&) = delete;
  PoolingDescriptor& operator=(const PoolingDescriptor&) = delete;
};

// cuDNN may decline a configuration (a layout, a stride pattern or a type it has no kernel for).
// Such a call launches nothing; the op then runs stepbench's kernel for good, and says so once per
// kind of refusal. Any other failure throws.
bool cudnn_ran(cudnnStatus_t st, const char* call, const char* file, int line) {
  if (st == CUDNN_STATUS_SUCCESS) return true;
  const int category = CUDNN_STATUS_CATEGORY(st);
  if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM) return false;
  throw_error(file, line, fmt::format("{} failed: {}", call, cudnnGetErrorString(st)));
}
#define SB_CUDNN_RAN(call) cudnn_ran((call), #call, __FILE__, __LINE__)

void note_fallback(const char* op, const char* step, const TensorDesc& x) {
  static std::mutex m;
  static std::set<std::string> said;
  const std::string what = fmt::format("{} {} on {} {}", op, step, to_string(x.layout), to_string(x.dtype));
  std::lock_guard<std::mutex> lock(m);
  if (said.insert(what).second)
    fmt::print(stderr, "stepbench: cuDNN declined {} ({}); stepbench's kernel runs it\n", what, to_string(x.shape));
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
      : c_(c), p_(p), x_(x), y_(y), xd_(x), yd_(y), bnd_(xd_.d) {
    SB_CHECK(x.shape == y.shape && x.dtype == y.dtype, "batch norm: x and y differ in shape or type");
    own_ = c.own_norm_pool || !x.is_dense();
    if (x.layout == Layout::nhwc) mode_ = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
    if (!own_ && p.relu && x.layout == Layout::nhwc && y.is_dense()) {
      std::size_t f = 0, b = 0, r = 0;
      fused_ = ex_sizes(CUDNN_BATCHNORM_OPS_BN_ACTIVATION, act_.d, f, b, r);
      if (fused_) {
        ex_ws_ = std::max(f, b);
        reserve_ = r;
      }
    }
    // NHWC without the fused ReLU (y a concat slice, or no ReLU): the Ex API with BN alone, on dense
    // buffers; the non-Ex calls take cuDNN's slow generic kernels for NHWC (measured on an H100: 44
    // such layers of Inception-v3 took about half of a bf16 training step).
    if (!own_ && !fused_ && x.layout == Layout::nhwc) {
      std::size_t f = 0, b = 0, r = 0;
      ex_bn_ = ex_sizes(CUDNN_BATCHNORM_OPS_BN, nullptr, f, b, r);
      if (ex_bn_) {
        ex_ws_ = std::max(f, b);
        reserve_ = r;
      }
    }
    // [masked gradient or dense y, x.bytes() | cuDNN's own workspace for the Ex calls]
    if (!own_) temp_ = (x.bytes() + 255) / 256 * 256;
  }
  std::size_t workspace_bytes() const override { return temp_ + ex_ws_; }
  std::size_t reserve_bytes() const override { return reserve_; }
  std::string implementation() const override {
    if (own_) return "stepbench kernel";
    return fmt::format("cudnn {}{}{} (inference: stepbench kernel)",
                       mode_ == CUDNN_BATCHNORM_SPATIAL_PERSISTENT ? "spatial persistent" : "spatial",
                       fused_ ? ", relu fused" : ex_bn_ ? " (Ex), dense copy" : "",
                       p_.relu && !fused_ ? ", relu pass" : "");
  }

  void forward_training(Stream& s, const Tensor& x, const Tensor& y, const float* gamma, const float* beta, float* rm,
                        float* rv, float* sm, float* si, void* ws, void* reserve) override {
    set(s);
    const float one = 1, zero = 0;
    if (!own_ && x.desc == x_ && y.desc == y_) {
      if (fused_) {
        if (SB_CUDNN_RAN(cudnnBatchNormalizationForwardTrainingEx(
                c_.cudnn, mode_, CUDNN_BATCHNORM_OPS_BN_ACTIVATION, &one, &zero, xd_.d, x.data, nullptr, nullptr,
                yd_.d, y.data, bnd_.d, gamma, beta, p_.momentum, rm, rv, p_.eps, sm, si, act_.d, ex_ws(ws), ex_ws_,
                reserve, reserve_)))
          return;
        fused_ = false;  // declined: BN, then our ReLU, from now on
        note_fallback("batch norm", "fused ReLU (Ex API)", x_);
      }
      if (ex_bn_) {
        // BN into a dense y in the workspace, then the ReLU (or a copy) into y, which may be a slice
        const Tensor t{ws, x_};
        if (SB_CUDNN_RAN(cudnnBatchNormalizationForwardTrainingEx(
                c_.cudnn, mode_, CUDNN_BATCHNORM_OPS_BN, &one, &zero, xd_.d, x.data, nullptr, nullptr, xd_.d, t.data,
                bnd_.d, gamma, beta, p_.momentum, rm, rv, p_.eps, sm, si, nullptr, ex_ws(ws), ex_ws_, reserve,
                reserve_))) {
          if (p_.relu)
            SB_CUDA(cuda::launch_relu_forward(view(t), view(y), S(s)));
          else
            SB_CUDA(cuda::launch_add(view(t), view(y), 0.0f, S(s)));
          return;
        }
        ex_bn_ = false;
        note_fallback("batch norm", "forward (Ex API)", x_);
      }
      while (!own_) {
        if (SB_CUDNN_RAN(cudnnBatchNormalizationForwardTraining(c_.cudnn, mode_, &one, &zero, xd_.d, x.data, yd_.d,
                                                                y.data, bnd_.d, gamma, beta, p_.momentum, rm, rv,
                                                                p_.eps, sm, si))) {
          if (p_.relu) SB_CUDA(cuda::launch_relu_forward(view(y), view(y), S(s)));
          return;
        }
        decline("forward");
      }
    }
    SB_CUDA(cuda::launch_bn_forward_training(view(x), view(y), gamma, beta, rm, rv, sm, si, p_.eps, p_.momentum,
                                             p_.relu, S(s)));
  }
  // Inference is one elementwise pass per channel's affine map (and the ReLU): our kernel, in the
  // tensor's memory order and fused with the ReLU, in one read and one write (cuDNN's would be a
  // second pass for the ReLU, and its NCHW-order kernel for strided NHWC slices is slow).
  void forward_inference(Stream& s, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                         const float* rm, const float* rv, void*) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_bn_forward_inference(view(x), view(y), gamma, beta, rm, rv, p_.eps, p_.relu, S(s)));
  }
  void backward(Stream& s, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* gamma,
                const float* beta, const float* sm, const float* si, float* dgamma, float* dbeta, float beta_dx,
                void* ws, const void* reserve) override {
    set(s);
    const float one = 1, zero = 0;
    if (!own_ && x.desc == x_ && y.desc == y_ && dx.desc == x_) {
      if (fused_ && dy.desc == y_) {
        if (SB_CUDNN_RAN(cudnnBatchNormalizationBackwardEx(
                c_.cudnn, mode_, CUDNN_BATCHNORM_OPS_BN_ACTIVATION, &one, &beta_dx, &one, &zero, xd_.d, x.data, yd_.d,
                y.data, yd_.d, dy.data, nullptr, nullptr, xd_.d, dx.data, bnd_.d, gamma, beta, dgamma, dbeta, p_.eps,
                sm, si, act_.d, ex_ws(ws), ex_ws_, const_cast<void*>(reserve), reserve_)))
          return;
        fused_ = false;
      }
      // the gradient cuDNN reads: dy masked by the ReLU (y > 0), or dy copied dense
      const Tensor g{ws, x_};
      if (p_.relu)
        SB_CUDA(cuda::launch_relu_backward(view(y), view(dy), view(g), 0.0f, S(s)));
      else
        SB_CUDA(cuda::launch_add(view(dy), view(g), 0.0f, S(s)));
      if (ex_bn_) {
        if (SB_CUDNN_RAN(cudnnBatchNormalizationBackwardEx(
                c_.cudnn, mode_, CUDNN_BATCHNORM_OPS_BN, &one, &beta_dx, &one, &zero, xd_.d, x.data, nullptr,
                nullptr, xd_.d, g.data, nullptr, nullptr, xd_.d, dx.data, bnd_.d, gamma, beta, dgamma, dbeta, p_.eps,
                sm, si, nullptr, ex_ws(ws), ex_ws_, const_cast<void*>(reserve), reserve_)))
          return;
        ex_bn_ = false;
        note_fallback("batch norm", "backward (Ex API)", x_);
      }
      while (!own_) {
        if (SB_CUDNN_RAN(cudnnBatchNormalizationBackward(c_.cudnn, mode_, &one, &beta_dx, &one, &zero, xd_.d, x.data,
                                                         xd_.d, g.data, xd_.d, dx.data, bnd_.d, gamma, dgamma, dbeta,
                                                         p_.eps, sm, si)))
          return;
        decline("backward");
      }
    }
    SB_CUDA(cuda::launch_bn_backward(view(x), view(y), view(dy), view(dx), gamma, sm, si, dgamma, dbeta, beta_dx,
                                     p_.relu, S(s)));
  }

 private:
  // persistent -> spatial -> our kernel
  void decline(const char* step) {
    if (mode_ == CUDNN_BATCHNORM_SPATIAL_PERSISTENT) {
      mode_ = CUDNN_BATCHNORM_SPATIAL;
      return;
    }
    own_ = true;
    note_fallback("batch norm", step, x_);
  }
  void* ex_ws(void* ws) const { return ex_ws_ ? static_cast<char*>(ws) + temp_ : nullptr; }
  // cuDNN's workspace (forward, backward) and reserve sizes for the Ex calls with these ops, or false
  // when it has no Ex kernel for them here
  bool ex_sizes(cudnnBatchNormOps_t ops, cudnnActivationDescriptor_t act, std::size_t& f, std::size_t& b,
                std::size_t& r) const {
    const bool fused = ops != CUDNN_BATCHNORM_OPS_BN;
    cudnnTensorDescriptor_t yd = fused ? yd_.d : xd_.d;  // OPS_BN writes a dense y (x's descriptor)
    return cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(c_.cudnn, mode_, ops, xd_.d, nullptr, yd,
                                                                    bnd_.d, act, &f) == CUDNN_STATUS_SUCCESS &&
           cudnnGetBatchNormalizationBackwardExWorkspaceSize(c_.cudnn, mode_, ops, xd_.d, fused ? yd : nullptr, yd,
                                                             nullptr, xd_.d, bnd_.d, act, &b) == CUDNN_STATUS_SUCCESS &&
           cudnnGetBatchNormalizationTrainingExReserveSpaceSize(c_.cudnn, mode_, ops, act, xd_.d, &r) ==
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
  BnParamDescriptor bnd_;
  ActivationDescriptor act_;
  cudnnBatchNormMode_t mode_ = CUDNN_BATCHNORM_SPATIAL;
  bool fused_ = false, ex_bn_ = false, own_ = false;
  std::size_t temp_ = 0, ex_ws_ = 0, reserve_ = 0;
};

// Pooling on cuDNN, strided descriptors on both sides (a max pool branch writes its concat slice),
// except NHWC average pooling.
// cuDNN's max pool backward finds the maximum again from x and y, so nothing is reserved; where
// cuDNN declines, our kernel does the same (argmax null).
class CudaPool final : public PoolOp {
 public:
  CudaPool(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const PoolParams& p)
      : c_(c), x_(x), y_(y), xd_(x), yd_(y), pd_(p),
        // NHWC average pooling: cuDNN has no channels-last kernel for it (a generic one ran 20x
        // slower than its max pool on an H100); ours walks channels-last memory in order.
        own_(c.own_norm_pool || (x.layout == Layout::nhwc && p.kind != PoolKind::max)) {
    SB_CHECK(pool_output_shape(x.shape, p) == y.shape, "pool output shape mismatch");
    a_ = cuda::PoolArgs{p.kh, p.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w,
                        p.kind == PoolKind::max ? 0 : p.kind == PoolKind::avg_include_pad ? 1 : 2};
  }
  std::size_t reserve_bytes() const override { return 0; }
  std::string implementation() const override { return own_ ? "stepbench kernel" : "cudnn"; }
  void forward(Stream& s, const Tensor& x, const Tensor& y, void*) override {
    set(s);
    const float one = 1, zero = 0;
    if (!own_ && x.desc == x_ && y.desc == y_) {
      if (SB_CUDNN_RAN(cudnnPoolingForward(c_.cudnn, pd_.d, &one, xd_.d, x.data, &zero, yd_.d, y.data))) return;
      own_ = true;
      note_fallback("pooling", "forward", x_);
    }
    SB_CUDA(cuda::launch_pool_forward(view(x), view(y), a_, nullptr, S(s)));
  }
  void backward(Stream& s, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta,
                const void*) override {
    set(s);
    const float one = 1;
    if (!own_ && x.desc == x_ && y.desc == y_ && dy.desc == y_ && dx.desc == x_) {
      if (SB_CUDNN_RAN(cudnnPoolingBackward(c_.cudnn, pd_.d, &one, yd_.d, y.data, yd_.d, dy.data, xd_.d, x.data, &beta,
                                            xd_.d, dx.data)))
        return;
      own_ = true;
      note_fallback("pooling", "backward", x_);
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

class CudaRelu final : public ReluOp {
 public:
  explicit CudaRelu(const Ctx& c) : c_(c) {}
  void forward(Stream& s, const Tensor& x, const Tensor& y) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_relu_forward(view(x), view(y), S(s)));
  }
  void backward(Stream& s, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_relu_backward(view(y), view(dy), view(dx), beta, S(s)));
  }

 private:
  Ctx c_;
};

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

// Labels outside [0, M) cannot be checked on the host before the kernel without a synchronisation:
// the kernel flags them, the flag is copied to pinned memory, and the next call reports it.
class CudaSoftmaxXent final : public SoftmaxCrossEntropyOp {
 public:
  CudaSoftmaxXent(const Ctx& c, const TensorDesc& l) : c_(c), N_(l.shape.n), M_(l.shape.c) {
    SB_CHECK(l.is_dense() && l.shape.h == 1 && l.shape.w == 1, "softmax cross-entropy takes dense N x M logits");
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cudaMallocHost(&host_flag_, sizeof(int)));
    *host_flag_ = 0;
  }
  ~CudaSoftmaxXent() override { cudaFreeHost(host_flag_); }
  // probabilities, per-sample losses, the bad-label flag
  std::size_t reserve_bytes() const override {
    return static_cast<std::size_t>(N_ * M_ + N_) * sizeof(float) + sizeof(int);
  }
  void forward(Stream& s, const Tensor& logits, const std::int32_t* labels, float* loss, void* reserve) override {
    check_flag();
    SB_CUDA(cudaSetDevice(c_.device));
    float* probs = static_cast<float*>(reserve);
    float* rows = probs + N_ * M_;
    int* flag = reinterpret_cast<int*>(rows + N_);
    SB_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), S(s)));
    SB_CUDA(cuda::launch_softmax_xent_forward(flat(logits.data, logits.desc.dtype), labels, loss, probs, rows, flag,
                                              N_, M_, S(s)));
    SB_CUDA(cudaMemcpyAsync(host_flag_, flag, sizeof(int), cudaMemcpyDeviceToHost, S(s)));
  }
  void backward(Stream& s, const std::int32_t* labels, const Tensor& dlogits, float scale, float beta,
                const void* reserve, const float* loss_scale) override {
    SB_CUDA(cudaSetDevice(c_.device));
    SB_CUDA(cuda::launch_softmax_xent_backward(labels, flat(dlogits.data, dlogits.desc.dtype),
                                               static_cast<const float*>(reserve), scale, beta, loss_scale, N_, M_,
                                               S(s)));
  }

 private:
  void check_flag() {
    if (*host_flag_ != 0) {
      const int sample = *host_flag_ - 1;
      *host_flag_ = 0;
      throw UsageError(fmt::format("the label of sample {} is outside [0, {}): the labels do not fit the model's "
                                   "number of classes",
                                   sample, M_));
    }
  }
  Ctx c_;
  long long N_, M_;
  int* host_flag_ = nullptr;
};

// ---- the backend ------------------------------------------------------------------------------------
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : dev_(device), stream_(device) {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cudaGetDeviceProperties(&prop_, dev_));
    SB_CUDNN(cudnnCreate(&cudnn_));
    SB_CUBLAS(cublasCreate(&cublas_));
    SB_CUBLAS(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  }
  ~CudaBackend() override {
    cublasDestroy(cublas_);
    cudnnDestroy(cudnn_);
  }

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return fmt::format("{} (GPU {})", prop_.name, dev_); }
  std::map<std::string, std::string> versions() const override {
    int rt = 0, drv = 0, cublas = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    cublasGetVersion(cublas_, &cublas);
    const std::size_t cudnn = cudnnGetVersion();
    int nccl = 0;
    ncclGetVersion(&nccl);  // the library loaded, which may differ from the headers built against
    auto v = [](int x) { return fmt::format("{}.{}", x / 1000, (x % 1000) / 10); };
    return {{"cuda_runtime", v(rt)},
            {"cuda_driver", v(drv)},
            {"cudnn", fmt::format("{}.{}.{}", cudnn / 10000, (cudnn % 10000) / 100, cudnn % 100)},
            {"cublas", std::to_string(cublas)},
            {"nccl", fmt::format("{}.{}.{}", nccl / 10000, (nccl % 10000) / 100, nccl % 100)},
            {"cudnn_built_against", fmt::format("{}.{}.{}", CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL)},
            {"compute_capability", fmt::format("{}.{}", prop_.major, prop_.minor)},
            {"tf32", tf32_ ? "on" : "off"}};
  }
  void require(DType t) const override {
    const int cc = prop_.major * 10 + prop_.minor;
    if (t == DType::bf16 && cc < 80)
      throw UnsupportedError(fmt::format("--precision bf16 needs compute capability 8.0 or later (Ampere); {} has {}.{}. "
                                         "Use --precision fp16 or fp32",
                                         device_name(), prop_.major, prop_.minor));
    if (t == DType::f16 && cc < 70)
      throw UnsupportedError(fmt::format("--precision fp16 needs tensor cores (compute capability 7.0 or later); {} "
                                         "has {}.{}. Use --precision fp32",
                                         device_name(), prop_.major, prop_.minor));
  }
  void set_tensor_math(bool allow_tf32) override {
    tf32_ = allow_tf32;
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUBLAS(cublasSetMathMode(cublas_, tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  }
  FilterFormat filter_format(Layout l) const override { return l == Layout::nhwc ? FilterFormat::ohwi : FilterFormat::oihw; }
  int device() const override { return dev_; }
  void set_workspace_limit(std::size_t bytes) override { budget_ = bytes; }

  void* allocate(std::size_t bytes) override {
    SB_CUDA(cudaSetDevice(dev_));
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw UsageError(fmt::format("out of GPU memory on {}: {:.1f} MiB requested, {:.1f} MiB free; use a smaller "
                                   "--batch-size",
                                   device_name(), static_cast<double>(bytes) / (1 << 20),
                                   static_cast<double>(free) / (1 << 20)));
    }
    return p;
  }
  void deallocate(void* p) override { cudaFree(p); }
  void* allocate_host(std::size_t bytes) override {
    void* p = nullptr;
    SB_CUDA(cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)));
    return p;
  }
  void deallocate_host(void* p) override { cudaFreeHost(p); }
  bool is_pinned(const void* p) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }
  std::size_t memory_available() const override {
    cudaSetDevice(dev_);
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return free;
  }

  Stream& default_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CudaStream>(dev_); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(dev_); }
  void record(Event& e, Stream& s) override { SB_CUDA(cudaEventRecord(static_cast<CudaEvent&>(e).e, S(s))); }
  void wait(Stream& s, Event& e) override { SB_CUDA(cudaStreamWaitEvent(S(s), static_cast<CudaEvent&>(e).e, 0)); }
  void synchronize(Stream& s) override { SB_CUDA(cudaStreamSynchronize(S(s))); }
  bool query(Stream& s) override {
    const cudaError_t e = cudaStreamQuery(S(s));
    if (e == cudaErrorNotReady) return false;
    SB_CUDA(e);
    return true;
  }
  double elapsed_ms(Event& a, Event& b) override {
    float ms = 0;
    SB_CUDA(cudaEventElapsedTime(&ms, static_cast<CudaEvent&>(a).e, static_cast<CudaEvent&>(b).e));
    return ms;
  }

  void begin_capture(Stream& s) override {
    SB_CUDA(cudaSetDevice(dev_));
    // thread-local: the input pipeline's threads may make CUDA calls meanwhile
    SB_CUDA(cudaStreamBeginCapture(S(s), cudaStreamCaptureModeThreadLocal));
  }
  std::unique_ptr<CapturedWork> end_capture(Stream& s) override {
    SB_CUDA(cudaSetDevice(dev_));
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(S(s), &g);
    if (e != cudaSuccess || !g) {
      cudaGetLastError();
      if (g) cudaGraphDestroy(g);
      throw Error(fmt::format("CUDA Graph capture failed ({}): something in the captured work allocated, "
                              "synchronised or ran on an unjoined stream",
                              cudaGetErrorString(e)));
    }
    try {
      return std::make_unique<CudaGraphWork>(g, dev_);
    } catch (...) {
      cudaGraphDestroy(g);
      throw;
    }
  }

  void copy(Stream& s, void* dst, const void* src, std::size_t bytes) override {
    if (bytes) SB_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(s)));
  }
  void memset_zero(Stream& s, void* dst, std::size_t bytes) override {
    if (bytes) SB_CUDA(cudaMemsetAsync(dst, 0, bytes, S(s)));
  }
  void fill(Stream& s, float* dst, float v, std::size_t n) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_fill(dst, v, n, S(s)));
  }

  std::unique_ptr<ConvOp> make_conv(const TensorDesc& x, const TensorDesc& y, const ConvParams& p) override {
    return std::make_unique<CudnnConv>(ctx(), x, y, p);
  }
  std::unique_ptr<BatchNormOp> make_batch_norm(const TensorDesc& x, const TensorDesc& y,
                                               const BatchNormParams& p) override {
    return std::make_unique<CudaBatchNorm>(ctx(), x, y, p);
  }
  std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) override {
    return std::make_unique<CudaPool>(ctx(), x, y, p);
  }
  std::unique_ptr<ReluOp> make_relu(const TensorDesc& x, const TensorDesc&) override {
    return std::make_unique<CudaRelu>(ctx());
  }
  std::unique_ptr<LinearOp> make_linear(const TensorDesc& x, const TensorDesc& y) override {
    return std::make_unique<CublasLinear>(ctx(), x, y);
  }
  std::unique_ptr<DropoutOp> make_dropout(const TensorDesc& x, double p) override {
    return std::make_unique<CudaDropout>(ctx(), x, p);
  }
  std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const TensorDesc& logits) override {
    return std::make_unique<CudaSoftmaxXent>(ctx(), logits);
  }

  void add(Stream& s, const Tensor& src, const Tensor& dst, float beta) override {
    SB_CHECK(src.shape() == dst.shape(), "add: shapes differ");
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_add(view(src), view(dst), beta, S(s)));
  }
  void scale(Stream& s, float* x, float alpha, std::size_t n) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_scale(x, alpha, n, S(s)));
  }
  void optimizer_update(Stream& s, const OptimizerConfig& cfg, float* params, const float* grads, float* s0, float* s1,
                        std::size_t n, const float* scaler) override {
    const cuda::OptArgs a{cfg.kind == OptimizerKind::sgd ? 0 : cfg.kind == OptimizerKind::momentum ? 1 : 2,
                          cfg.lr, cfg.weight_decay, cfg.momentum, cfg.rms_decay, cfg.epsilon};
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_optimizer_update(a, params, grads, s0, s1, n, scaler, S(s)));
  }
  void cast(Stream& s, const void* src, DType from, void* dst, DType to, std::size_t n) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_cast(flat(src, from), flat(dst, to), n, S(s)));
  }
  void check_finite(Stream& s, const float* x, std::size_t n, float* scaler) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_check_finite(x, n, scaler, S(s)));
  }
  void update_loss_scale(Stream& s, float* scaler, int growth_interval) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_update_loss_scale(scaler, growth_interval, S(s)));
  }

 private:
  Ctx ctx() const { return Ctx{dev_, cudnn_, cublas_, tf32_, budget_, own_norm_pool_}; }
  int dev_;
  cudaDeviceProp prop_{};
  CudaStream stream_;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  bool tf32_ = false;
  std::size_t budget_ = std::size_t{512} << 20;  // cuDNN workspace budget (--workspace-mb)
  const bool own_norm_pool_ = [] {
    const char* v = std::getenv("STEPBENCH_CUDA_OWN_KERNELS");
    return v && std::string(v) == "1";
  }();
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  const int n = cuda_device_count_impl();
  if (device < 0 || device >= n)
    throw UsageError(fmt::format("GPU {} requested but {} visible", device, n));
  return std::make_unique<CudaBackend>(device);
}

}  // namespace stepbench
