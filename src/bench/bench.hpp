// The benchmark run: builds the towers for a BenchConfig, warms up, registers the Google Benchmark
// fixtures of every phase (and, with per_layer, every distinct conv shape), runs them with
// device-side manual timing and prints a summary table after Google Benchmark's output.
#pragma once
#include <string>
#include <vector>

#include "bench/config.hpp"
#include "comm/process_group.hpp"

namespace stepbench {

// Returns the process exit code (2 for a bad --benchmark_* flag). Throws UsageError /
// UnsupportedError for the caller to report. `peer_dirs`: where to look for bench/torch_peer.py.
int run_benchmarks(const BenchConfig& c, const ProcessGroup& group, const char* argv0,
                   const std::vector<std::string>& peer_dirs);

}  // namespace stepbench
