#include "backend/registry.hpp"

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.hpp"
#include "tensor/error.hpp"
#ifdef STEPBENCH_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#endif

namespace stepbench {

int cuda_device_count() {
#ifdef STEPBENCH_HAVE_CUDA
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

std::string cuda_unavailable_reason() {
#ifdef STEPBENCH_HAVE_CUDA
  return cuda_unavailable_reason_impl();
#else
  return "stepbench was built without CUDA support (configure with -DSTEPBENCH_CUDA=ON)";
#endif
}

BackendKind resolve(BackendKind kind) {
  if (kind != BackendKind::automatic) return kind;
  return cuda_unavailable_reason().empty() ? BackendKind::cuda : BackendKind::cpu;
}

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  std::unique_ptr<Backend> be;
  const BackendKind kind = resolve(o.kind);
  if (kind == BackendKind::cpu) {
    be = make_cpu_backend(o.emulate_bf16);
  } else {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) throw UnsupportedError(fmt::format("--backend cuda: {}; use --backend cpu or auto", why));
#ifdef STEPBENCH_HAVE_CUDA
    be = make_cuda_backend(CudaBackendOptions{o.device, o.own_kernels, o.plans});
#endif
  }
  be->set_tensor_math(tensor_math(o.precision));
  be->set_workspace_limit(o.workspace_bytes);
  be->set_memory_limit(o.memory_limit_bytes, o.memory_share);
  return be;
}

}  // namespace stepbench
