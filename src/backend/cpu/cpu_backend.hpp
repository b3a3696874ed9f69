// The cpu backend: oneDNN for convolution and inner product, OpenMP kernels for the rest.
#pragma once
#include <memory>

#include "backend/backend.hpp"

namespace stepbench {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace stepbench
