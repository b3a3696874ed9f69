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

bool cudnn_ran(cudnnStatus_t st, const char* call, const char* file, int line) {
  if (st == CUDNN_STATUS_SUCCESS) return true;
  const int category = CUDNN_STATUS_CATEGORY(st);
  if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM) return false;
  throw_error(file, line, fmt::format("{} failed: {}", call, cudnnGetErrorString(st)));
}

void FallbackNotes::note(const char* op, const char* step, const TensorDesc& x) {
  const std::string what = fmt::format("{} {} on {} {}", op, step, to_string(x.layout), to_string(x.dtype));
  std::lock_guard<std::mutex> lock(m_);
  if (said_.insert(what).second)
    fmt::print(stderr, "stepbench: cuDNN declined {} ({}); stepbench's kernel runs it\n", what, to_string(x.shape));
}

}  // namespace stepbench::cuda
