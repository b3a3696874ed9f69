// The run's last stages (stages.hpp): what the root process says and keeps once the fixtures and
// the probes are done. A run cut short says what was measured and stops there; a whole run is kept
// (--history, the plan cache, --suggest, the input stages), then reported: the summary, the
// sections the flags asked for, the trace's and the peer's lines.
#include <fmt/format.h>

#include <cmath>
#include <iostream>

#include "bench/input_report.hpp"
#include "bench/peer_layers.hpp"
#include "bench/report.hpp"
#include "bench/stats.hpp"
#include "bench/suggest.hpp"
#include "bench/text.hpp"

#include "bench/stages.hpp"

namespace stepbench {

double timed_step_ms(const Run& run, const Timings& t) {
  const auto it = t.reporter->reps.find(run.prefix + "/step");
  std::vector<double> v;
  if (it != t.reporter->reps.end())
    for (const auto& x : it->second) v.push_back(x.device_ms);
  return v.empty() ? NAN : median(v);
}

namespace {

void print_peer_line(const Run& run, const PeerResult& peer) {
  std::cout
      << wrap(fmt::format(
                  "peer: PyTorch {}{} (bench/torch_peer.py, {}), same model, batch, layout, precision, dropout, "
                  "threads and warm-up; stepbench/PT compares {}; below 1: stepbench is faster{}",
                  peer.torch, run.c.peer == PeerKind::pytorch_compile ? " with torch.compile" : "", peer.python,
                  peer.timing == "cuda events"
                      ? "device time between events on both sides (the host ratio: host wall time per call on both)"
                      : "host wall time on both sides",
                  run.gpus != 1 ? "; ratios only for --gpus 1" : ""),
              6)
      << wrap("peer settings: " + peer.settings, 15);
}

}  // namespace

void add_json_section(const Run& run, const Timings& t, const std::string& key, const nlohmann::json& v) {
  if (run.c.json.empty() || !run.root) return;
  if (t.json_in_place)
    std::cerr << "stepbench: --json " << run.c.json << " is not a regular file: its " << key
              << " section is not in it\n";
  else
    add_to_json_file(run.c.json, key, v);
}

int other_process_exit(const Run& run, const Timings& t, const Probes& p) {
  if (run.stop.signal()) return 128 + run.stop.signal();
  return t.reporter->errors.empty() && run.stop.halted().empty() && !p.failed ? 0 : 1;
}

Exit report_cut_short(Run& run, const Timings& t, const Probes& p) {
  const BenchConfig& c = run.c;
  const Interrupt& stop = run.stop;
  const SummaryReporter& rep = *t.reporter;
  if (!stop.signal() && stop.local()) {  // after the last benchmark's check: all measured, but stop here
    print_summary(c, *run.towers, rep, run.prefix, PeerResult{}, *run.feeder,
                  memory_report(*run.towers, run.resident_before));
    std::cout << fmt::format(
        "interrupted by signal {} after the benchmarks: every row above was measured; no peer "
        "ran{}\n",
        stop.local(), c.history.empty() ? "" : " and nothing was appended to --history");
    return 128 + stop.local();
  }
  if (!stop.signal() && stop.halted().empty()) return std::nullopt;
  // what was measured, said as such; no history record, no peer
  print_summary(c, *run.towers, rep, run.prefix, PeerResult{}, *run.feeder,
                memory_report(*run.towers, run.resident_before));
  int cut = 0;
  for (const auto& [name, n] : rep.cut_short) cut += n;
  std::cout << wrap(fmt::format(
      "{}. The rows above are the repetitions measured before it; {} repetitions of {} benchmarks were not run "
      "(marked \"{}\"{}){}",
      stop.signal() ? "cut short by " + stop.name() : stop.halted(), cut, rep.cut_short.size(),
      stop.signal() ? stop.message() : "not run: ...", c.json.empty() ? "" : " in --json " + c.json,
      c.history.empty() ? "" : "; nothing was appended to --history"));
  return stop.signal() ? 128 + stop.signal() : 1;
}

void keep_run(Run& run, const Timings& t) {
  const BenchConfig& c = run.c;
  Feeder& feeder = *run.feeder;
  if (!c.history.empty()) append_history(c, *run.towers, *t.reporter);
  if (!c.plan_cache.empty() && c.run.plans) c.run.plans->save(c.plan_cache);  // with the per-layer rigs' plans
  if (c.suggest && feeder.pipeline()) feeder.set_remedies(run_suggest(feeder, run.towers->backend(0)));
  if (feeder.pipeline() && (feeder.measure().images > 0 || c.suggest)) {
    try {
      add_json_section(run, t, "input_stages", input_stages_json(feeder));
    } catch (const Error& e) {
      std::cerr << "stepbench: " << e.what() << "\n";
    }
  }
}

int report(Run& run, const Timings& t, const Probes& p, const PeerResult& peer) {
  const BenchConfig& c = run.c;
  MemoryReport memory = memory_report(*run.towers, run.resident_before);
  if (p.peak.source == "measured" && run.resident_timed && run.resident_timed->peak > 0 &&
      run.resident_timed->peak < memory.after.peak)
    memory.after = *run.resident_timed;  // the peak's GEMM raised the high-water mark, not the step
  memory.peer_torch = peer.torch;
  memory.peer_baseline = peer.baseline_rss;
  memory.peer_peak = peer.peak_rss;
  memory.peer_cuda = peer.cuda_max_allocated;
  add_json_section(run, t, "memory_plan", memory_json(memory));
  print_summary(c, *run.towers, *t.reporter, run.prefix, peer, *run.feeder, memory, peak_answer(run, t, p.peak));
  if (p.async) print_async(std::cout, run, *p.async);
  if (p.stragglers) print_stragglers(std::cout, run, *p.stragglers);
  if (p.layer_times) {
    print_layer_times(*p.layer_times, 12, timed_step_ms(run, t));
    if (!peer.layers.empty()) print_peer_layers(match_peer_layers(*p.layer_times, peer), peer, 12);
  }
  if (p.projection) {
    // the point this run measured: one GPU's step (its median), or the processes' (the slowest's)
    std::vector<std::pair<int, double>> measured;
    if (const double ms = timed_step_ms(run, t); ms > 0) measured.emplace_back(run.gpus, ms);
    if (!c.fabric_note.empty()) std::cout << "\n" << wrap("--fabric-from: " + c.fabric_note, 2);
    if (c.fabric_from == "run")
      std::cout << "\n"
                << wrap(
                       "--fabric-from run: the links are the busbw each level of the gradient sync reached in the "
                       "grad_sync fixture (the sync alone), with no latency",
                       2);
    print_projection(*p.projection, p.fabric, project(*p.projection, p.fabric, c.project_gpus), measured,
                     c.run.batch_per_tower);
  }
  if (!run.trace.empty())
    std::cout << fmt::format("trace: {} (open it in https://ui.perfetto.dev or chrome://tracing){}\n", run.trace,
                             run.group.size() > 1 ? "; every process's towers in it, each on its own clock" : "");
  if (!peer.empty()) print_peer_line(run, peer);
  if (!run.peer_python.empty() && peer.empty()) {
    std::cerr << "stepbench: --peer " << to_string(c.peer)
              << " gave no figures (the reason is above); stepbench's own are complete, the exit status is 1\n";
    return 1;
  }
  return t.reporter->errors.empty() && !p.failed ? 0 : 1;
}

}  // namespace stepbench
