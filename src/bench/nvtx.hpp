// An NVTX range for Nsight Systems and Nsight Compute (`ncu --nvtx --nvtx-include "step/"`): the
// warm-up and every timed iteration of a phase, named after it; in the probed steps of
// --layer-times and --trace also every piece of every layer ("Mixed_5b.branch1x1/conv_fwd").
// Nothing without CUDA.
#pragma once
#include <string>

#if defined(STEPBENCH_HAVE_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define STEPBENCH_NVTX 1
#endif

namespace stepbench {

#ifdef STEPBENCH_NVTX
inline constexpr bool kNvtxEnabled = true;
inline void nvtx_push(const std::string& name) { nvtxRangePushA(name.c_str()); }
inline void nvtx_pop() { nvtxRangePop(); }
#else
inline constexpr bool kNvtxEnabled = false;
inline void nvtx_push(const std::string&) {}
inline void nvtx_pop() {}
#endif

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
