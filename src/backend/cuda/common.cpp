// The helpers common.hpp declares for the cuda backend's op files.
#include "backend/cuda/common.hpp"

#include <cstdio>

namespace stepbench::cuda {

CudaStream::CudaStream(int device) {
  SB_CUDA(cudaSetDevice(device));
  cudaStream_t h = nullptr;
  SB_CUDA(cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking));
  s = StreamHandle(h);
}

TensorDescriptor tensor_descriptor(const TensorDesc& t) {
  cudnnTensorDescriptor_t h = nullptr;
  SB_CUDNN(cudnnCreateTensorDescriptor(&h));
  TensorDescriptor d(h);
  SB_CUDNN(cudnnSetTensor4dDescriptorEx(
      d.get(), cudnn_type(t.dtype), static_cast<int>(t.shape.n), static_cast<int>(t.shape.c),
      static_cast<int>(t.shape.h), static_cast<int>(t.shape.w), static_cast<int>(t.strides.n),
      static_cast<int>(t.strides.c), static_cast<int>(t.strides.h), static_cast<int>(t.strides.w)));
  return d;
}

void CublasBinding::reserve(int device) {
  if (workspace.get()) return;
  SB_CUDA(cudaSetDevice(device));
  bytes = std::size_t{32} << 20;
  void* p = nullptr;
  SB_CUDA(cudaMalloc(&p, bytes));
  workspace = DeviceBuffer(p);
  bound = false;
}

void CublasBinding::bind(cudaStream_t s) {
  if (bound && s == stream) return;
  SB_CUBLAS(cublasSetStream(handle, s));
  if (workspace.get()) SB_CUBLAS(cublasSetWorkspace(handle, workspace.get(), bytes));
  stream = s;
  bound = true;
}

CudnnVerdict classify_cudnn_status(int status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return CudnnVerdict::ran;
    // the legacy API's answer to a configuration it has no kernel for
    case CUDNN_STATUS_BAD_PARAM:
    case 2001:  // CUDNN_STATUS_INVALID_VALUE (deprecated spelling of BAD_PARAM)
    case CUDNN_STATUS_NOT_SUPPORTED:
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN:
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE:
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE:
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT:
    case CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT:
    case CUDNN_STATUS_NOT_SUPPORTED_PADDING:
    case CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM:
    case CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API:
    case CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE: return CudnnVerdict::declined;
    // the installation, not the configuration
    case CUDNN_STATUS_NOT_INITIALIZED:
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH:
    case CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH:
    case CUDNN_STATUS_LICENSE_ERROR:
    case CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART:
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING:
    case CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE: return CudnnVerdict::unavailable;
    default:  // BAD_PARAM_* sub-codes (our call is wrong), INTERNAL_ERROR*, EXECUTION_FAILED*, unknown codes
      return CudnnVerdict::failed;
  }
}

const char* to_string(CudnnVerdict v) {
  switch (v) {
    case CudnnVerdict::ran: return "ran";
    case CudnnVerdict::declined: return "declined";
    case CudnnVerdict::unavailable: return "unavailable";
    case CudnnVerdict::failed: return "failed";
  }
  return "?";
}

cudnnStatus_t cudnn_try(cudnnStatus_t st, const char* call, const char* file, int line) {
  const CudnnVerdict v = classify_cudnn_status(st);
  if (v == CudnnVerdict::ran || v == CudnnVerdict::declined) return st;
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (v == CudnnVerdict::unavailable)
    throw_error(file, line,
                fmt::format("{} failed: {} ({}): this cuDNN installation cannot run here; check that cuDNN's "
                            "sub-libraries (libcudnn_*.so.9) are all present and of one version, and that the "
                            "driver and GPU are ones this cuDNN supports",
                            call, cudnnGetErrorString(st), detail));
  throw_error(file, line, fmt::format("{} failed: {} ({})", call, cudnnGetErrorString(st), detail));
}

void FallbackNotes::note(const char* op, const char* step, const TensorDesc& x, cudnnStatus_t st, const char* instead) {
  const std::string what = fmt::format("{} {} on {} {}: {} -> {}", op, step, to_string(x.layout), to_string(x.dtype),
                                       cudnnGetErrorString(st), instead);
  std::lock_guard<std::mutex> lock(m_);
  if (count_[what]++ == 0) {
    char detail[512] = {};
    cudnnGetLastErrorString(detail, sizeof detail);
    fmt::print(stderr, "stepbench: cuDNN declined {} {} on {} {} ({}): {}{}{}; {} runs it from now on\n", op, step,
               to_string(x.layout), to_string(x.dtype), to_string(x.shape), cudnnGetErrorString(st),
               detail[0] ? ": " : "", detail, instead);
  }
}

std::string FallbackNotes::summary() const {
  std::lock_guard<std::mutex> lock(m_);
  std::string s;
  for (const auto& [what, n] : count_) s += fmt::format("{}{} x {}", s.empty() ? "" : "; ", n, what);
  return s.empty() ? "none" : s;
}

}  // namespace stepbench::cuda
