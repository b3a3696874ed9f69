// The parallel loops of the hand-written kernels. Include this after STEPBENCH_CPU_ISA_BEGIN
// (isa.hpp): the templates are then compiled for the kernel file's instruction set, so the loop
// bodies (lambdas of that set) inline into them.
#pragma once
#include <cstdint>

#include "backend/cpu/common.hpp"
#include "backend/cpu/isa.hpp"

namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS {

// Calls body(n, h, w) for every pixel of `s`, in parallel over rows.
template <class F>
void for_each_pixel(const Shape& s, F&& body) {
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t w = 0; w < s.w; ++w) body(n, h, w);
}

// Calls row(n, c, h) for every row of an NCHW shape, in parallel: each row's s.w values are
// contiguous, also in a channel slice, so the inner loops stream and vectorise along w.
template <class F>
void for_each_nchw_row(const Shape& s, F&& row) {
#pragma omp parallel for collapse(3) schedule(static)
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t h = 0; h < s.h; ++h) row(n, c, h);
}

}  // namespace stepbench::cpu::STEPBENCH_CPU_ISA_NS
