// One error-check macro per library (CUDA runtime, cuDNN, cuBLAS, NCCL); each throws
// stepbench::Error with file:line and the call. Only <cuda_runtime.h> is included here: the other
// macros name their library's status type and error-string function, which the file using them
// has included (<cudnn.h>, <cublas_v2.h>, <nccl.h>), so a file that uses only SB_CUDA and SB_NCCL
// (src/comm) builds without the cuDNN headers.
#pragma once
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "tensor/error.hpp"

#define SB_CUDA(call)                                                                                        \
  do {                                                                                                       \
    cudaError_t sb_err_ = (call);                                                                            \
    if (sb_err_ != cudaSuccess)                                                                              \
      ::stepbench::throw_error(                                                                              \
          __FILE__, __LINE__,                                                                                \
          fmt::format("{} failed: {} ({})", #call, cudaGetErrorString(sb_err_), cudaGetErrorName(sb_err_))); \
  } while (0)

#define SB_CUDNN(call)                                                                                                \
  do {                                                                                                                \
    cudnnStatus_t sb_st_ = (call);                                                                                    \
    if (sb_st_ != CUDNN_STATUS_SUCCESS)                                                                               \
      ::stepbench::throw_error(__FILE__, __LINE__, fmt::format("{} failed: {}", #call, cudnnGetErrorString(sb_st_))); \
  } while (0)

#define SB_CUBLAS(call)                                                                             \
  do {                                                                                              \
    cublasStatus_t sb_st_ = (call);                                                                 \
    if (sb_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
      ::stepbench::throw_error(__FILE__, __LINE__,                                                  \
                               fmt::format("{} failed: {}", #call, cublasGetStatusString(sb_st_))); \
  } while (0)

// ncclGetLastError: NCCL's message for the last error, which says more than the status string.
#define SB_NCCL(call)                                                                                       \
  do {                                                                                                      \
    ncclResult_t sb_nr_ = (call);                                                                           \
    if (sb_nr_ != ncclSuccess)                                                                              \
      ::stepbench::throw_error(                                                                             \
          __FILE__, __LINE__,                                                                               \
          fmt::format("{} failed: {} ({})", #call, ncclGetErrorString(sb_nr_), ncclGetLastError(nullptr))); \
  } while (0)
