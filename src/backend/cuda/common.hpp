// What the cuda backend's op files share: the context every op of one backend gets (Ctx), the
// stream type, conversions from stepbench's tensors to cuDNN/cuBLAS types and kernel views, the
// "cuDNN declined" fallback check, and the factory of each op (one op per file: conv.cpp,
// linear.cpp, batch_norm.cpp, pool.cpp, relu.cpp, dropout.cpp, softmax_cross_entropy.cpp).
// Internal to src/backend/cuda.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "backend/backend.hpp"
#include "backend/cuda/check.hpp"
#include "backend/cuda/handles.hpp"
#include "backend/cuda/kernels.hpp"

namespace stepbench::cuda {

class FallbackNotes;  // below

struct Ctx {  // what every op of one backend shares
  int device;
  cudnnHandle_t cudnn;
  cublasHandle_t cublas;
  bool tf32;
  std::size_t workspace_budget;
  bool own_norm_pool;    // CudaBackendOptions::own_kernels: batch norm and pooling on our kernels, not cuDNN
  FallbackNotes* notes;  // the backend's, which outlives its ops
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
// cuDNN may decline a configuration (a layout, a stride pattern or a type it has no kernel for).
// Such a call launches nothing; the op then runs stepbench's kernel for good, and says so once per
// kind of refusal (Ctx::notes). Any other failure throws.
bool cudnn_ran(cudnnStatus_t st, const char* call, const char* file, int line);
#define SB_CUDNN_RAN(call) ::stepbench::cuda::cudnn_ran((call), #call, __FILE__, __LINE__)

// The kinds of "cuDNN declined" one backend has reported (ops of several threads may report).
class FallbackNotes {
 public:
  // Prints, once per backend for each op, step, layout and type, that stepbench's kernel runs it.
  void note(const char* op, const char* step, const TensorDesc& x);

 private:
  std::mutex m_;
  std::set<std::string> said_;
};

// ---- the ops ---------------------------------------------------------------------------------------
std::unique_ptr<ConvOp> make_cuda_conv(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const ConvParams& p);
std::unique_ptr<LinearOp> make_cuda_linear(const Ctx& c, const TensorDesc& x, const TensorDesc& y);
std::unique_ptr<BatchNormOp> make_cuda_batch_norm(const Ctx& c, const TensorDesc& x, const TensorDesc& y,
                                                  const BatchNormParams& p);
std::unique_ptr<PoolOp> make_cuda_pool(const Ctx& c, const TensorDesc& x, const TensorDesc& y, const PoolParams& p);
std::unique_ptr<ReluOp> make_cuda_relu(const Ctx& c);
std::unique_ptr<DropoutOp> make_cuda_dropout(const Ctx& c, const TensorDesc& x, double p);
std::unique_ptr<SoftmaxCrossEntropyOp> make_cuda_softmax_cross_entropy(const Ctx& c, const TensorDesc& logits);

}  // namespace stepbench::cuda
