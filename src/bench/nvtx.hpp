// An NVTX range for Nsight Systems and Nsight Compute (`ncu --nvtx --nvtx-include "step/"`): the
// warm-up and every timed iteration of a phase, named after it. Nothing without CUDA.
#pragma once
#include <string>

#if defined(STEPBENCH_HAVE_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define STEPBENCH_NVTX 1
#endif

namespace stepbench {

struct NvtxRange {
  explicit NvtxRange(const std::string& name) {
#ifdef STEPBENCH_NVTX
    nvtxRangePushA(name.c_str());
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#ifdef STEPBENCH_NVTX
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace stepbench
