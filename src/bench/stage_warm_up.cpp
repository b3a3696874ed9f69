// The run's second stage (stages.hpp): untimed steps, so that algorithm choice, the first touch of
// every buffer and the caches are out of the timing; then the check that the numbers are finite
// (timing NaN arithmetic measures something else) and the configuration into the JSON context.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "bench/nvtx.hpp"
#include "bench/report.hpp"
#include "bench/stages.hpp"

namespace stepbench {

Exit warm_up(Run& run) {
  const BenchConfig& c = run.c;
  Towers& towers = *run.towers;
  for (int i = 0; i < std::max(c.warmup, 1) && !(run.group.size() == 1 && run.stop.local()); ++i) {
    run.progress.set(fmt::format("warm-up step {}/{}", i + 1, std::max(c.warmup, 1)));
    NvtxRange nv("warmup");
    towers.step();
    towers.forward_inference();
  }
  towers.synchronize();
  run.progress.clear();
  if (run.stop.agreed()) {
    if (run.root)
      std::cerr << "stepbench: cut short by " << run.stop.name() << " during warm-up: nothing was measured\n";
    return 128 + run.stop.signal();
  }
  // a blown-up warm-up stops here (every process)
  const std::string bad = numeric_trouble(towers);
  if (run.group.allreduce_max(bad.empty() ? 0.0 : 1.0) > 0) {
    std::cerr << "stepbench: the numbers stopped being finite during warm-up: "
              << (bad.empty() ? "on another process" : bad) << "; nothing was timed\n";
    return 1;
  }
  add_context(c, towers);
  return std::nullopt;
}

}  // namespace stepbench
