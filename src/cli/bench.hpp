// The benchmark run: builds the towers for the resolved options, warms up, registers the Google
// Benchmark fixtures of every phase (and, with --per-layer, every distinct conv shape), runs them
// with device-side manual timing and prints a summary table after Google Benchmark's output.
#pragma once
#include "options.hpp"

namespace stepbench::cli {

// Returns the process exit code. Throws UsageError / UnsupportedError for the caller to report.
int run_benchmarks(Options& o, const char* argv0);

}  // namespace stepbench::cli
