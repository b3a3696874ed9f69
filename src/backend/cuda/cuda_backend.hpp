// The cuda backend: cuDNN, cuBLAS and stepbench's kernels on one GPU.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "backend/plan_cache.hpp"

namespace stepbench {

struct CudaBackendOptions {
  int device = 0;
  // Batch norm and pooling on stepbench's kernels, never cuDNN's: the path the backend falls back to
  // where cuDNN declines a configuration, forced for testing it (ctest ops.cuda_own_kernels).
  bool own_kernels = false;
  // The convolution plans (cudnnFind's choices) this backend looks up before searching and records
  // after; several backends may share one. Null: a cache of its own.
  std::shared_ptr<ConvPlanCache> plans;
};

// Throws UnsupportedError when the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& o);
// Visible CUDA devices; 0 when none. Never throws.
int cuda_device_count_impl();
// Why no GPU is usable, or "" when one is.
std::string cuda_unavailable_reason_impl();

}  // namespace stepbench
