// The CUDA backend. So far: device discovery and the reason no GPU is usable. The cuDNN/cuBLAS ops
// are the CUDA-backend issue's work; until then make_cuda_backend() says so instead of pretending.
#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>

#include "cuda/check.hpp"
#include "stepbench/backend.hpp"

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

std::unique_ptr<Backend> make_cuda_backend(int device) {
  const int n = cuda_device_count_impl();
  if (device < 0 || device >= n)
    throw UsageError(fmt::format("GPU {} requested but {} visible", device, n));
  throw UnsupportedError(fmt::format(
      "the cuda backend's ops are not implemented in this build yet (cuDNN {}.{}.{}, NCCL {}.{}.{} linked); "
      "use --backend cpu",
      CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
}

}  // namespace stepbench
