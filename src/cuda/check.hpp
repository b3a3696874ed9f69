// One error-check macro per library; each throws stepbench::Error with file:line and the call.
#pragma once
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "stepbench/error.hpp"

#define SB_CUDA(call)                                                                                       \
  do {                                                                                                      \
    cudaError_t sb_err_ = (call);                                                                           \
    if (sb_err_ != cudaSuccess)                                                                             \
      ::stepbench::throw_error(__FILE__, __LINE__,                                                          \
                               fmt::format("{} failed: {} ({})", #call, cudaGetErrorString(sb_err_),         \
                                           cudaGetErrorName(sb_err_)));                                     \
  } while (0)
