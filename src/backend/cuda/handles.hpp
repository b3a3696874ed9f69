// Owning handles for cuDNN descriptors and CUDA objects: one move-only template instead of a
// hand-written RAII struct per type. A Handle takes over an object once it has been created, so
// an error while configuring it (a throwing SB_CUDNN) still destroys it.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <utility>

namespace stepbench::cuda {

// Owns h (null: nothing) and calls Destroy(h) when it goes.
template <class T, auto Destroy>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T h) : h_(h) {}
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (h_) Destroy(h_);
  }
  T get() const { return h_; }

 private:
  T h_ = nullptr;
};

using TensorDescriptor = Handle<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDescriptor = Handle<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor = Handle<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;
using ActivationDescriptor = Handle<cudnnActivationDescriptor_t, cudnnDestroyActivationDescriptor>;
using PoolingDescriptor = Handle<cudnnPoolingDescriptor_t, cudnnDestroyPoolingDescriptor>;

using CudnnHandle = Handle<cudnnHandle_t, cudnnDestroy>;
using CublasHandle = Handle<cublasHandle_t, cublasDestroy>;

using StreamHandle = Handle<cudaStream_t, cudaStreamDestroy>;
using EventHandle = Handle<cudaEvent_t, cudaEventDestroy>;
using GraphHandle = Handle<cudaGraph_t, cudaGraphDestroy>;
using GraphExecHandle = Handle<cudaGraphExec_t, cudaGraphExecDestroy>;
// cudaMalloc'd device memory and cudaMallocHost'd (pinned) host memory.
using DeviceBuffer = Handle<void*, cudaFree>;
using PinnedBuffer = Handle<void*, cudaFreeHost>;

}  // namespace stepbench::cuda
