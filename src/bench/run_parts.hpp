// The parts of the run's stages (stages.hpp) that are not a stage: Google Benchmark's command line
// and --json file, the counters, the names for --list, the numeric health check. Internal to
// src/bench.
#pragma once
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/config.hpp"
#include "bench/feeder.hpp"
#include "bench/phases.hpp"
#include "train/towers.hpp"

namespace stepbench {

inline benchmark::Counter avg(double total) { return benchmark::Counter(total, benchmark::Counter::kAvgIterations); }
inline benchmark::Counter rate(double per_iteration) {
  return benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

inline bool has(const std::vector<Phase>& v, Phase p) { return std::find(v.begin(), v.end(), p) != v.end(); }

// The work per image, for TFLOP/s.
struct Flops {
  double forward, train_forward;  // per image; backward counts as twice the forward
};

// The command line handed to Google Benchmark. Initialize keeps a pointer to argv[0]
// (BenchmarkReporter::Context::executable_name, which the reporters print), so the storage must
// outlive the run: run_benchmarks owns it until it returns, and its end shuts Google Benchmark down.
struct BenchmarkArgv {
  std::vector<std::string> args;
  std::vector<char*> argv;
  bool initialized = false;
  BenchmarkArgv() = default;
  BenchmarkArgv(const BenchmarkArgv&) = delete;
  BenchmarkArgv& operator=(const BenchmarkArgv&) = delete;
  ~BenchmarkArgv() {
    if (initialized) benchmark::Shutdown();
  }
};

// Removes the partial --json file unless the run renamed it (a run that throws leaves nothing behind).
struct PartialJson {
  std::string path;
  ~PartialJson() {
    if (!path.empty()) std::remove(path.c_str());
  }
};

// "" when every tower's parameters and gradients are finite (Graph::step_finite); else where the
// first non-finite number of the first tower in trouble is (one more step is run to find it). Never
// in a timed loop.
std::string numeric_trouble(const Towers& t);
// Where Google Benchmark writes --json until the run is over: FILE.partial.PID for a regular or new
// file, so that a run that dies leaves no half-written file under the name asked for; a FIFO or
// /dev/stdout is written in place, as asked.
std::string json_partial(const BenchConfig& c);
// Google Benchmark's flags first, so that a bad one fails before minutes of set-up. False: one was
// not recognised (reported on stderr).
bool init_google_benchmark(const BenchConfig& c, bool root, const char* argv0, BenchmarkArgv& keep);
// The names this configuration registers, without running anything (--list).
void list_names(const BenchConfig& c, const Towers& towers, const std::vector<Phase>& phases, const std::string& prefix,
                const Feeder& feeder, bool data_step);
void set_rate_counters(benchmark::State& st, Phase p, const Towers& towers, double images, const Flops& fl);
// A sync in levels (Towers::sync_levels, before and after the timed loop): each level's host time
// per iteration, the slowest process's (a collective: every process calls it), as `<key>_ms`, and
// its `<key>_algbw_GB/s` and `<key>_busbw_GB/s` from this process's bytes.
void set_level_counters(benchmark::State& st, const std::vector<SyncLevel>& before, const std::vector<SyncLevel>& after,
                        const ProcessGroup& group);

}  // namespace stepbench
