// The model phases as a table: what one timed iteration launches, and the timing points it marks
// (point 0 is the start, the last the stop; the ones between split forward, backward, sync, update).
#pragma once
#include <span>

#include "bench/config.hpp"
#include "bench/region_timer.hpp"
#include "train/towers.hpp"

namespace stepbench {

struct PhaseDef {
  Phase phase;
  int points;                          // timing points, start and stop included
  void (*run)(Towers&, RegionTimer&);  // launches one iteration, marking points 1 .. points-2
};

// Every phase timed on the model (input_pipeline is timed apart, on the host clock).
std::span<const PhaseDef> model_phases();
const PhaseDef* find_phase(Phase p);  // nullptr for input_pipeline

}  // namespace stepbench
