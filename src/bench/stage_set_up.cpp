// The run's first stage (stages.hpp): what can fail fast fails before minutes of set-up (Google
// Benchmark's flags, the files the run writes and reads, the peer's Python), then the towers and the feeder.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "bench/peak.hpp"
#include "bench/stages.hpp"
#include "bench/text.hpp"
#include "tensor/error.hpp"

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
  if (!run.trace.empty() && run.root) {  // a test file beside it, removed
    std::ofstream t(run.trace + ".partial");
    if (!t) {
      std::cerr << "stepbench: --trace " << run.trace << " cannot be written; give a file in a writable folder\n";
      return 2;
    }
    std::remove((run.trace + ".partial").c_str());
  }
  if (run.root && !c.sweep() && !c.peak.cache.empty() &&
      (c.peak.mode == PeakMode::automatic || c.peak.mode == PeakMode::measure)) {
    try {  // a damaged peak cache is said now, not after the run
      load_peak_cache(c.peak.cache);
    } catch (const UsageError& e) {
      std::cerr << "stepbench: " << e.what() << "\n";
      return 2;
    }
  }
  return std::nullopt;
}

// --project-gpus over several processes checks the model against the run: one tower per process, and
// a fabric of the run's shape. "" when it may go on.
std::string projection_refusal(const BenchConfig& c, const ProcessGroup& g) {
  if (c.project_gpus.empty()) return c.fabric_from == "run" ? "--fabric-from run needs --project-gpus" : "";
  if (g.size() == 1) {
    if (c.fabric_from == "run")
      return "--fabric-from run fits the links to this run's gradient sync across processes, and this run has one: "
             "run it with several processes, or give the link (--fabric, --link-*, --fabric-from FILE)";
    if (c.run.variable_update == VariableUpdate::distributed_all_reduce)
      return "--project-gpus checks distributed_all_reduce's two levels against a run of several processes (stepbench "
             "launch --nproc N --nodes M); from one process project --variable-update replicated";
    return "";
  }
  if (c.run.towers != 1)
    return fmt::format(
        "--project-gpus over {} processes checks the projection against this run, a GPU per process: use --gpus 1 "
        "(this run has {} towers per process)",
        g.size(), c.run.towers);
  const bool two = c.run.variable_update == VariableUpdate::distributed_all_reduce;
  const int per = g.has_levels() ? g.within_node().size() : 0;  // 0: distributed_all_reduce refuses the run
  if (c.fabric_from == "run") {
    if (two && c.run.backend == BackendKind::cuda)
      return "--fabric-from run fits each level's busbw, and GPU towers do not time their levels yet: give the "
             "links (--fabric or --link-*, --gpus-per-node with --node-fabric or --node-link-*)";
    if (two && per > 0 && g.across_nodes().size() < 2)
      return "--fabric-from run fits the link between nodes, and this run has one node: run it on several "
             "(stepbench launch --nodes M), or use replicated";
    return "";
  }
  if (!two && c.gpus_per_node > 0 && per > 0 && c.gpus_per_node != per)
    return fmt::format("--project-gpus checks this run of {} processes per node: give --gpus-per-node {}, or drop it",
                       per, per);
  if (!two) return "";
  if (per > 0 && c.gpus_per_node != per)
    return fmt::format(
        "--project-gpus checks distributed_all_reduce's two levels against this run of {} processes per node: give "
        "--gpus-per-node {} with the link within a node, or --fabric-from run",
        per, per);
  return "";
}

// What runs in one process only, and the peer's Python: a missing torch is found before the
// benchmarks, not after.
Exit check_single_process_flags(Run& run) {
  const BenchConfig& c = run.c;
  if (const std::string why = projection_refusal(c, run.group); !why.empty()) {
    if (run.root) std::cerr << "stepbench: " << why << "\n";
    return 2;
  }
  if (c.peer != PeerKind::none && run.group.size() > 1) {
    if (run.root) std::cerr << "stepbench: --peer runs PyTorch in one process; drop it with several processes\n";
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

// "N towers x batch B" in the header: GPUs on cuda, CPU towers on the cpu, several processes with
// their transport and launcher.
std::string towers_text(const Run& run) {
  const auto& r = run.c.run;
  const bool gpu = r.backend == BackendKind::cuda;
  const auto n = [](int k, const char* one, const char* many) { return fmt::format("{} {}", k, k == 1 ? one : many); };
  const std::string per = gpu ? n(r.towers, "GPU", "GPUs") : n(r.towers, "tower", "towers");
  if (run.group.size() > 1) {
    const int nodes = run.group.nodes();  // "2 nodes x 2 processes": processes per node
    // across hosts, each a node: their names ("2 nodes (gpu01, gpu02) x 8 processes"), at most three
    std::vector<std::string> hosts;
    for (const auto& p : run.group.peers())
      if (std::find(hosts.begin(), hosts.end(), p.host) == hosts.end()) hosts.push_back(p.host);
    std::string named;
    if (nodes > 1 && static_cast<int>(hosts.size()) == nodes)
      named = nodes <= 3 ? fmt::format(" ({})", fmt::join(hosts, ", "))
                         : fmt::format(" ({}, {}, ... {})", hosts[0], hosts[1], hosts.back());
    const std::string procs = nodes > 1 ? fmt::format("{}{} x {}", n(nodes, "node", "nodes"), named,
                                                      n(run.group.size() / nodes, "process", "processes"))
                                        : n(run.group.size(), "process", "processes");
    return fmt::format("{} ({}, started by {}) x {} x batch {}", procs, run.group.transport_name(),
                       run.group.launcher_name(), per, r.batch_per_tower);
  }
  return fmt::format("{} x batch {}", per, r.batch_per_tower);
}

// The header (hyperfine's): what runs, where, how big; the reduced CPU default said once, under it.
void print_header(const Run& run) {
  const auto& r = run.c.run;
  const Backend& be = run.towers->backend(0);
  const std::string model =
      fmt::format("{} {} {} {}x{}{}", to_string(r.model), to_string(r.precision), to_string(r.layout),
                  r.model_options.image_size, r.model_options.image_size, r.fuse == Fuse::on ? " fused" : "");
  std::string device = short_device_name(be.device_name());
  auto line = [&] {
    return fmt::format("stepbench {} · {} · {}: {} · {}", STEPBENCH_VERSION, model, be.name(), device,
                       towers_text(run));
  };
  if (const std::size_t w = columns(line()); w > kWidth) {  // the device's name gives way, at a word
    const std::size_t keep = device.size() > w - kWidth + 3 ? device.size() - (w - kWidth + 3) : 0;
    const std::size_t cut = device.rfind(' ', keep);
    device = device.substr(0, cut == std::string::npos ? keep : cut) + "...";
  }
  std::cout << line() << "\n";
  if (run.c.reduced()) std::cout << wrap(run.c.reduced_note);
  std::cout << std::flush;  // before minutes of warm-up, also into a pipe
}

// The towers (planned, cuDNN's algorithms chosen) and what the step's input comes from.
void build_towers(Run& run) {
  const BenchConfig& c = run.c;
  const auto& r = c.run;
  run.resident_before = resident_memory();
  run.towers = std::make_unique<Towers>(r);
  if (!c.plan_cache.empty() && r.plans && run.root) r.plans->save(c.plan_cache);  // kept even if the run fails later
  run.towers->set_synthetic_batch(42);
  const Graph& g0 = run.towers->graph(0);
  run.flops = Flops{2.0 * static_cast<double>(g0.forward_macs_per_image(false)),
                    2.0 * static_cast<double>(g0.forward_macs_per_image(true))};
  // asynchronous workers each time their own steps: a row's images are this process's
  run.images = static_cast<double>(r.batch_per_tower * (run.towers->asynchronous() ? run.towers->size() : run.gpus));
  run.feeder = std::make_unique<Feeder>(c, *run.towers);
  run.data_step = run.feeder->active() && has(run.phases, Phase::step);
  // every tower's timeline in the step fixture: which one the step waits for, and its cost
  // (not for asynchronous workers, whose steps wait for no one: their report is stage_async's)
  const bool towers_to_compare = run.towers->global_size() >= 2 && has(run.phases, Phase::step);
  run.stragglers.on = towers_to_compare && !run.towers->asynchronous();
  if (c.straggler_top_given && !run.stragglers.on)
    throw UsageError(
        fmt::format("--straggler-top lists the towers of the step: it needs two towers or more (--gpus "
                    "2, or several processes) and the step phase (there are {} tower{})",
                    run.towers->global_size(), run.towers->global_size() == 1 ? "" : "s"));
  if (c.slow_tower >= run.towers->global_size() && towers_to_compare)
    throw UsageError(fmt::format("--slow-tower {}: there are {} towers (0 to {}); name one of them", c.slow_tower,
                                 run.towers->global_size(), run.towers->global_size() - 1));
  if (c.slow_tower >= 0 && !towers_to_compare)
    throw UsageError(
        fmt::format("--slow-tower slows one tower against the others: it needs two towers or more "
                    "(--gpus 2, or several processes) and the step phase (there are {} towers{})",
                    run.towers->global_size(), has(run.phases, Phase::step) ? "" : ", no step"));
}

}  // namespace

Run::Run(const BenchConfig& config, const ProcessGroup& g, std::vector<std::string> peer_script_dirs)
    : c(config),
      group(g),
      root(g.rank() == 0),
      gpus(config.run.towers * g.size()),
      prefix(benchmark_prefix(config, gpus)),
      peer_dirs(std::move(peer_script_dirs)),
      stop(config.interrupt, g),
      progress(config.progress && g.rank() == 0) {}

Exit set_up(Run& run, const char* argv0) {
  const BenchConfig& c = run.c;
  if (!init_google_benchmark(c, run.root, argv0, run.benchmark_argv)) return 2;
  run.trace = c.trace;  // every process probes; rank 0 gathers the traces and writes the one file
  {                     // the root checks the files it writes; every process ends if one is refused
    const Exit e = check_output_files(run);
    if (run.group.size() > 1 && run.group.allreduce_max(e ? 1.0 : 0.0) > 0) return e ? e : Exit{2};
    if (e) return e;
  }
  if (Exit e = check_single_process_flags(run)) return e;
  run.phases = phases_to_time(c);
  run.progress.set("setting up: planning the towers");
  build_towers(run);
  run.progress.clear();
  if (run.root) print_header(run);
  if (c.list) {
    if (run.root) list_names(c, *run.towers, run.phases, run.prefix, *run.feeder, run.data_step);
    return 0;
  }
  return std::nullopt;
}

}  // namespace stepbench
