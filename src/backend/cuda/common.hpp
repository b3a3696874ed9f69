// What the cuda backend's op files share: the context every op of one backend gets (Ctx), the
// stream type, conversions from stepbench's tensors to cuDNN/cuBLAS types and kernel views, the
// "cuDNN declined" fallback check, and the factory of each op (one op per file: conv.cpp,
// linear.cpp, batch_norm.cpp, pool.cpp, relu.cpp, add_relu.cpp, dropout.cpp, softmax_cross_entropy.cpp).
// Internal to src/backend/cuda.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/backend.hpp"
#include "backend/cuda/check.hpp"
#include "backend/cuda/handles.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/plan_cache.hpp"

namespace stepbench::cuda {

class FallbackNotes;  // below

// The backend's cuBLAS handle bound to a stream and to a workspace of its own. cublasSetStream resets
// the workspace to cuBLAS's pool, which allocates on first use (also inside a CUDA Graph capture, which
// then holds allocation nodes), so the stream and the workspace are set together, and only when an op
// runs on another stream than the last one.
struct CublasBinding {
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace;
  std::size_t bytes = 0;
  cudaStream_t stream = nullptr;
  bool bound = false;
  // The workspace, once per backend, at planning time: 32 MiB, PyTorch's choice for Hopper
  // (CUBLAS_WORKSPACE_CONFIG :4096:8), enough for every GEMM of an FC layer.
  void reserve(int device);
  void bind(cudaStream_t s);
};

struct Ctx {  // what every op of one backend shares
  int device;
  cudnnHandle_t cudnn;
  CublasBinding* blas;
  bool tf32;
  std::size_t workspace_budget;
  bool own_norm_pool;    // CudaBackendOptions::own_kernels: batch norm and pooling on our kernels, not cuDNN
  FallbackNotes* notes;  // the backend's, which outlives its ops
  ConvPlanCache* plans;  // the backend's (maybe shared with other backends), which outlives its ops
  std::string machine;   // this GPU's part of a plan's key: model, compute capability, driver, cuDNN
  bool sizing_only;      // Backend::sizing_only: ops that are never run, made without searches or buffers
};

struct CudaStream final : Stream {
  StreamHandle s;
  explicit CudaStream(int device);
  void* native_handle() override { return s.get(); }
};
inline cudaStream_t S(Stream& s) { return static_cast<CudaStream&>(s).s.get(); }

// ---- type conversions ------------------------------------------------------------------------------
inline int elem(DType t) { return t == DType::f32 ? kF32 : t == DType::bf16 ? kBF16 : kF16; }
inline cudnnDataType_t cudnn_type(DType t) {
  return t == DType::f32 ? CUDNN_DATA_FLOAT : t == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}
inline cudaDataType_t cuda_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : t == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
}

inline View view(const Tensor& t) {
  const auto& d = t.desc;
  return View{t.data,      d.shape.n,   d.shape.c,   d.shape.h,   d.shape.w,
              d.strides.n, d.strides.c, d.strides.h, d.strides.w, elem(d.dtype)};
}
inline Flat flat(const void* p, DType t) { return Flat{const_cast<void*>(p), elem(t)}; }

// A strided 4-D cuDNN descriptor of t (a concat slice keeps its strides).
TensorDescriptor tensor_descriptor(const TensorDesc& t);

// ---- cuDNN declining a configuration --------------------------------------------------------------
// What a cuDNN status means for the caller (the table is classify_cudnn_status, tested on every
// status cuDNN 9 defines):
//   ran        CUDNN_STATUS_SUCCESS
//   declined   cuDNN has no kernel for this configuration (the generic BAD_PARAM and INVALID_VALUE,
//              which the legacy API returns for an unsupported layout or type, and the NOT_SUPPORTED
//              codes of a shape, type, layout, padding, pattern, shared memory or launch): nothing was
//              launched; the op falls back for good and says so once (FallbackNotes)
//   unavailable this installation cannot run cuDNN here (a sub-library missing or of another
//              version, a driver or runtime too old, an architecture not built, a licence): the run
//              stops with the call and what to install
//   failed     everything else: a bug in stepbench's call (NULL or misaligned pointer, workspace too
//              small, stream or CUDA Graph mismatch, a descriptor out of bounds or of the wrong type,
//              mismatched shapes), an internal error or a failed execution: the run stops with the call
enum class CudnnVerdict { ran, declined, unavailable, failed };
CudnnVerdict classify_cudnn_status(int status);
const char* to_string(CudnnVerdict v);

// SUCCESS or a status that declines the configuration; throws Error naming the call otherwise.
cudnnStatus_t cudnn_try(cudnnStatus_t st, const char* call, const char* file, int line);
#define SB_CUDNN_TRY(call) ::stepbench::cuda::cudnn_try((call), #call, __FILE__, __LINE__)

// The kinds of fallback one backend has taken (ops of several threads may report): each kind is
// printed once on stderr with cuDNN's status, and counted per op that took it.
class FallbackNotes {
 public:
  // op (e.g. "batch norm"), what cuDNN declined ("forward (Ex API)"), the input, cuDNN's status, and
  // what runs instead ("stepbench's kernel", "the spatial (not persistent) kernels").
  void note(const char* op, const char* step, const TensorDesc& x, cudnnStatus_t st, const char* instead);
  // "3 x batch norm forward (Ex API) on nhwc bf16: CUDNN_STATUS_NOT_SUPPORTED -> stepbench's kernel; ..."
  // or "none": for the JSON context.
  std::string summary() const;

 private:
  mutable std::mutex m_;
  std::map<std::string, int> count_;
};

// ---- the ops ---------------------------------------------------------------------------------------
// --decode gpu (image_decode.cpp): nvJPEG and the pipeline's transforms on `device`.
std::unique_ptr<ImageDecodeOp> make_cuda_image_decoder(int device, const ImageDecodeParams& p);
std::unique_ptr<ConvOp> make_cuda_conv(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const ConvParams& p);
std::unique_ptr<LinearOp> make_cuda_linear(const Ctx& c, const TensorDesc& x, const TensorDesc& y);
std::unique_ptr<BatchNormOp> make_cuda_batch_norm(const Ctx& c, const TensorDesc& x, const TensorDesc& y,
                                                  const BatchNormParams& p);
std::unique_ptr<PoolOp> make_cuda_pool(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const PoolParams& p);
std::unique_ptr<ReluOp> make_cuda_relu(const Ctx& c, float clip);
std::unique_ptr<BiasActOp> make_cuda_bias_act(const Ctx& c, bool relu);
std::unique_ptr<AdaptiveAvgPoolOp> make_cuda_adaptive_avg_pool(const Ctx& c);
std::unique_ptr<AddReluOp> make_cuda_add_relu(const Ctx& c);
std::unique_ptr<DropoutOp> make_cuda_dropout(const Ctx& c, const TensorDesc& x, double p);
std::unique_ptr<SoftmaxCrossEntropyOp> make_cuda_softmax_cross_entropy(const Ctx& c, const TensorDesc& logits);

}  // namespace stepbench::cuda
