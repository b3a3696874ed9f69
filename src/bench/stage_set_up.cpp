// The run's first stage (stages.hpp): what can fail fast fails before minutes of set-up (Google
// Benchmark's flags, the files the run writes, the peer's Python), then the towers and the feeder.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "bench/stages.hpp"

namespace stepbench {
namespace {

std::string benchmark_prefix(const BenchConfig& c, int gpus) {
  const auto& r = c.run;
  return fmt::format("{}/{}/{}/gpus:{}/batch:{}", to_string(r.model), to_string(r.precision), to_string(r.layout), gpus,
                     r.batch_per_tower);
}

// --history and --trace: a path that cannot be written fails now, not after the run.
Exit check_output_files(const Run& run) {
  const BenchConfig& c = run.c;
  if (!c.history.empty() && run.root) {
    std::ofstream h(c.history, std::ios::app);
    if (!h) {
      std::cerr << "stepbench: --history " << c.history << " cannot be appended to; give a file in a writable folder\n";
      return 2;
    }
  }
  if (!run.trace.empty()) {  // a test file beside it, removed
    std::ofstream t(run.trace + ".partial");
    if (!t) {
      std::cerr << "stepbench: --trace " << run.trace << " cannot be written; give a file in a writable folder\n";
      return 2;
    }
    std::remove((run.trace + ".partial").c_str());
  }
  return std::nullopt;
}

// What runs in one process only, and the peer's Python: a missing torch is found before the
// benchmarks, not after.
Exit check_single_process_flags(Run& run) {
  const BenchConfig& c = run.c;
  if (!c.project_gpus.empty() && run.group.size() > 1) {
    if (run.root)
      std::cerr << "stepbench: --project-gpus starts from one GPU's step in one process; drop it under mpirun\n";
    return 2;
  }
  if (c.peer != PeerKind::none && run.group.size() > 1) {
    if (run.root) std::cerr << "stepbench: --peer runs PyTorch in one process; drop it under mpirun\n";
    return 2;
  }
  if (c.peer != PeerKind::none && !c.list) {
    run.peer_python = choose_peer_python(c);
    if (run.peer_python.empty()) return 2;
  }
  return std::nullopt;
}

std::vector<Phase> phases_to_time(const BenchConfig& c) {
  std::vector<Phase> phases = c.phases;
  if (phases.empty())
    for (const auto& n : names_of<Phase>()) phases.push_back(*try_parse_enum<Phase>(n));
  if (c.data == DataKind::synthetic) std::erase(phases, Phase::input_pipeline);
  return phases;
}

void print_start_line(const Run& run) {
  const auto& r = run.c.run;
  std::cerr << fmt::format(
      "stepbench: {} x {} on {}{}, batch {} per tower, {}x{} {} {}{}\n", run.gpus, to_string(r.model),
      to_string(r.backend),
      run.group.size() > 1 ? fmt::format(" ({} processes x {} towers, MPI)", run.group.size(), r.towers) : "",
      r.batch_per_tower, r.model_options.image_size, r.model_options.image_size, to_string(r.precision),
      to_string(r.layout), run.c.reduced() ? fmt::format(" [{}]", run.c.reduced_note) : "");
}

// The towers (planned, cuDNN's algorithms chosen) and what the step's input comes from.
void build_towers(Run& run) {
  const BenchConfig& c = run.c;
  const auto& r = c.run;
  run.towers = std::make_unique<Towers>(r);
  if (!c.plan_cache.empty() && r.plans && run.root) r.plans->save(c.plan_cache);  // kept even if the run fails later
  run.towers->set_synthetic_batch(42);
  const Graph& g0 = run.towers->graph(0);
  run.flops = Flops{2.0 * static_cast<double>(g0.forward_macs_per_image(false)),
                    2.0 * static_cast<double>(g0.forward_macs_per_image(true))};
  run.images = static_cast<double>(r.batch_per_tower * run.gpus);
  run.feeder = std::make_unique<Feeder>(c, *run.towers);
  run.data_step = run.feeder->active() && has(run.phases, Phase::step);
}

}  // namespace

Run::Run(const BenchConfig& config, const ProcessGroup& g, std::vector<std::string> peer_script_dirs)
    : c(config),
      group(g),
      root(g.rank() == 0),
      gpus(config.run.towers * g.size()),
      prefix(benchmark_prefix(config, gpus)),
      peer_dirs(std::move(peer_script_dirs)),
      stop(config.interrupt, g) {}

Exit set_up(Run& run, const char* argv0) {
  const BenchConfig& c = run.c;
  if (!init_google_benchmark(c, run.root, argv0, run.benchmark_argv)) return 2;
  run.trace = c.trace.empty() || run.root ? c.trace : fmt::format("{}.rank{}", c.trace, run.group.rank());
  if (Exit e = check_output_files(run)) return e;
  if (Exit e = check_single_process_flags(run)) return e;
  run.phases = phases_to_time(c);
  if (run.root) print_start_line(run);
  build_towers(run);
  if (c.list) {
    if (run.root) list_names(c, *run.towers, run.phases, run.prefix, *run.feeder, run.data_step);
    return 0;
  }
  return std::nullopt;
}

}  // namespace stepbench
