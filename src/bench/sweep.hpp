// --sweep-batch / --sweep-gpus: the training step over a grid of per-GPU batch sizes and GPU
// (tower) counts in one run, with images/s, the step's median, the scaling efficiency (images/s at
// N GPUs over N times the smallest count's, per batch) and the largest batch per GPU that planning
// accepts. Runs instead of the Google Benchmark fixtures.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/config.hpp"
#include "comm/process_group.hpp"

namespace stepbench {

struct SweepRow {
  int gpus = 0;  // towers in all (per process x processes)
  std::int64_t batch = 0;
  bool fits = true;  // false: planning refuses the batch (or the towers could not be built), not run
  std::string why;   // when not fits
  double step_ms = 0, images_per_s = 0;
  double efficiency = -1;  // -1: no smaller count to compare with, or not run
  int steps_per_repetition = 0;
};

// The efficiency column: per batch, images/s at N GPUs over (N / N0) times images/s at the smallest
// count N0 that ran.
void fill_scaling_efficiency(std::vector<SweepRow>& rows);

// Returns the exit code; prints the table (process 0) and writes c.json with a "sweep" section.
int run_sweep(const BenchConfig& c, const ProcessGroup& group);

}  // namespace stepbench
