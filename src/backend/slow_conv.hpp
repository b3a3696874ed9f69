// A test-only fault for the regression gate's tests (scripts/ab.sh, ctest ci.ab): every
// convolution of one shape repeats one direction's work, as a kernel that got slower would. The
// command line reads it from STEPBENCH_FAULT_SLOW_CONV; it reaches the graph (GraphConfig) and the
// per-layer benchmarks, so both the step and that shape's per-layer row slow down.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "backend/fused.hpp"

namespace stepbench {

struct SlowConvFault {
  std::string shape;              // as conv_shape_name, e.g. "conv:16x24x15x15>16:k1x1:s1x1:p0x0"
  std::string direction = "fwd";  // fwd, bwd_data or bwd_filter
  int repeats = 0;                // extra runs of that direction per call; 0: no fault
  bool active() const { return repeats > 0 && !shape.empty(); }
};

// The name of a convolution shape in per-layer benchmark names: input NxCxHxW, output channels,
// kernel, stride, padding.
std::string conv_shape_name(const Shape& x, std::int64_t cout, const ConvParams& p);

// `op`, or when `f` names this shape, `op` wrapped to run f.direction 1 + f.repeats times (results
// unchanged: the repeated calls overwrite; a backward data call that accumulates runs once).
std::unique_ptr<ConvOp> with_fault(std::unique_ptr<ConvOp> op, const Shape& x, std::int64_t cout, const ConvParams& p,
                                   const SlowConvFault& f);
// The same for a fused unit's convolution (backend/fused.hpp).
std::unique_ptr<FusedConvOp> with_fault(std::unique_ptr<FusedConvOp> op, const Shape& x, std::int64_t cout,
                                        const ConvParams& p, const SlowConvFault& f);

}  // namespace stepbench
