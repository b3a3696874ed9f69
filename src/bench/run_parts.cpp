// The parts of the run's stages that are not a stage (run_parts.hpp).
#include "bench/run_parts.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>

#include "bench/per_layer.hpp"

namespace stepbench {

std::string numeric_trouble(const Towers& t) {
  for (int i = 0; i < t.size(); ++i) {
    if (t.graph(i).step_finite(t.stream(i))) continue;
    const std::string where = t.graph(i).first_non_finite(t.stream(i));
    return fmt::format("{}the first non-finite number: {}", t.size() > 1 ? fmt::format("tower {}: ", i) : "",
                       where.empty() ? "none in one more step (it came back)" : where);
  }
  return "";
}

std::string json_partial(const BenchConfig& c) {
  struct stat st {};
  const bool regular = stat(c.json.c_str(), &st) == 0 ? S_ISREG(st.st_mode) : errno == ENOENT;
  return regular ? fmt::format("{}.partial.{}", c.json, getpid()) : c.json;
}

bool init_google_benchmark(const BenchConfig& c, bool root, const char* argv0, BenchmarkArgv& keep) {
  keep.args = {argv0};
  // every benchmark's repetitions (mean, median, stddev and cv aggregates) as Google Benchmark's flag,
  // not each benchmark's Repetitions(): that would put "repeats:N" in every name, and runs with
  // different counts would not match in compare.py
  keep.args.push_back(fmt::format("--benchmark_repetitions={}", c.repetitions));
  for (const auto& a : c.benchmark_args) keep.args.push_back(a);
  if (!c.json.empty() && root) {
    keep.args.push_back("--benchmark_out=" + json_partial(c));  // renamed to --json once whole
    keep.args.emplace_back("--benchmark_out_format=json");
  }
  keep.argv.clear();
  for (auto& a : keep.args) keep.argv.push_back(a.data());
  int argc = static_cast<int>(keep.argv.size());
  benchmark::Initialize(&argc, keep.argv.data());
  keep.initialized = true;
  return !benchmark::ReportUnrecognizedArguments(argc, keep.argv.data());
}

void list_names(const BenchConfig& c, const Towers& towers, const std::vector<Phase>& phases, const std::string& prefix,
                const Feeder& feeder, bool data_step) {
  for (Phase p : phases)
    if (p != Phase::grad_sync || towers.sync_bytes() > 0) std::cout << prefix << "/" << to_string(p) << "\n";
  if (data_step) std::cout << prefix << "/step:data=" << feeder.name() << "\n";
  if (c.cuda_graph)
    for (Phase p : {Phase::forward, Phase::step})
      if (has(phases, p)) std::cout << prefix << "/" << to_string(p) << ":cuda_graph\n";
  if (c.per_layer)
    for (const auto& cs : distinct_convs(towers.graph(0)))
      for (const char* k : {"fwd", "bwd_data", "bwd_filter"})
        std::cout << prefix << "/" << cs.name() << "/" << k << "\n";
}

void set_rate_counters(benchmark::State& st, Phase p, const Towers& towers, double images, const Flops& fl) {
  switch (p) {
    case Phase::forward:
      st.counters["images/s"] = rate(images);
      st.counters["TFLOP/s"] = rate(images * fl.forward / 1e12);
      break;
    case Phase::forward_train:
      st.counters["images/s"] = rate(images);
      st.counters["TFLOP/s"] = rate(images * fl.train_forward / 1e12);
      break;
    case Phase::forward_backward:
    case Phase::step:
      st.counters["images/s"] = rate(images);
      st.counters["TFLOP/s"] = rate(images * 3.0 * fl.train_forward / 1e12);
      break;
    case Phase::grad_sync: {
      const double gb = static_cast<double>(towers.sync_bytes()) / 1e9;
      st.counters["algbw_GB/s"] = rate(gb);
      st.counters["busbw_GB/s"] = rate(gb * towers.bus_factor());
      st.counters["bytes"] = static_cast<double>(towers.sync_bytes());
      st.counters["buckets"] = static_cast<double>(towers.bucket_count());
      break;
    }
    case Phase::update:
      st.counters["params/s"] = rate(static_cast<double>(towers.graph(0).num_parameters()) * towers.size());
      break;
    case Phase::input_pipeline: break;
  }
}

void set_level_counters(benchmark::State& st, const std::vector<SyncLevel>& before, const std::vector<SyncLevel>& after,
                        const ProcessGroup& group) {
  if (after.empty() || before.size() != after.size()) return;
  const double n = std::max<double>(1.0, static_cast<double>(st.iterations()));
  std::vector<double> ms;
  for (std::size_t i = 0; i < after.size(); ++i) ms.push_back((after[i].seconds - before[i].seconds) * 1e3 / n);
  group.allreduce_max(ms);
  for (std::size_t i = 0; i < after.size(); ++i) {
    const SyncLevel& l = after[i];
    const double gb = (l.bytes - before[i].bytes) / n / 1e9;
    st.counters[l.key + "_ms"] = ms[i];
    st.counters[l.key + "_algbw_GB/s"] = ms[i] > 0 ? gb / (ms[i] / 1e3) : 0.0;
    st.counters[l.key + "_busbw_GB/s"] = ms[i] > 0 ? gb * l.bus_factor / (ms[i] / 1e3) : 0.0;
  }
}

}  // namespace stepbench
