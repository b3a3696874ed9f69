// The cpu backend: oneDNN for convolution and inner product, OpenMP kernels for the rest.
#pragma once
#include <memory>

#include "backend/backend.hpp"

namespace stepbench {

// emulate_bf16: BackendOptions::emulate_bf16 (tests only); registry.hpp gives its default.
std::unique_ptr<Backend> make_cpu_backend(bool emulate_bf16);

}  // namespace stepbench
