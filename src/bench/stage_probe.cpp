// The run's fourth stage (stages.hpp): --layer-times, --trace and --project-gpus run probed steps
// after the timed repetitions (every process together), once the measured --json is in place:
// nothing here can take it away. A signal that came after the last benchmark skips them without
// counting as agreed (the summary says it came after them).
#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "bench/fabric.hpp"
#include "bench/stages.hpp"
#include "bench/stats.hpp"

namespace stepbench {
namespace {

// One trace for the run: the other processes' events (their towers numbered over every process)
// gathered into rank 0's file.
void write_trace(const Run& run, const std::vector<ProbedStep>& steps, bool activity, const std::string& note) {
  const Towers& towers = *run.towers;
  nlohmann::json j = trace_json(steps, towers,
                                {{"stepbench", run.prefix},
                                 {"revision", run.c.revision},
                                 {"backend", towers.backend(0).name()},
                                 {"device", towers.backend(0).device_name()},
                                 {"steps", steps.size()},
                                 {"processes", run.group.size()},
                                 {"clock", towers.backend(0).name() == "cpu" ? "steady clock" : "device events"},
                                 {"kernels", activity ? note : "none on the cpu backend"}});
  if (run.group.size() > 1) {
    const std::vector<std::string> parts = run.group.allgather(j.dump());
    if (!run.root) return;
    for (std::size_t r = 1; r < parts.size(); ++r) {
      nlohmann::json other = nlohmann::json::parse(parts[r]);  // alive through the loop below
      for (auto& e : other.at("traceEvents")) j["traceEvents"].push_back(std::move(e));
    }
  }
  write_json_file(run.trace, j);
}

// --fabric-from run: the links from the grad_sync fixture's busbw, each level's median over the
// repetitions (fabric.hpp). UsageError when the fixture did not run or moved nothing.
Fabric fabric_of_this_run(const Run& run, const Timings& t) {
  const auto it = t.reporter->reps.find(run.prefix + "/grad_sync");
  const auto med = [&](const std::string& counter) {
    std::vector<double> v;
    if (it != t.reporter->reps.end())
      for (const auto& r : it->second)
        if (const auto c = r.counters.find(counter); c != r.counters.end() && c->second > 0) v.push_back(c->second);
    return v.empty() ? 0.0 : median(v);
  };
  RunLinks r;
  const ProcessGroup& g = run.group;
  if (run.c.run.variable_update == VariableUpdate::distributed_all_reduce) {
    r.per_node = g.within_node().size();
    r.node_reduce_scatter_GBps = med("node_reduce_scatter_busbw_GB/s");
    r.across_GBps = med("cross_node_all_reduce_busbw_GB/s");
    r.node_all_gather_GBps = med("node_all_gather_busbw_GB/s");
  } else {
    r.flat_GBps = med("busbw_GB/s");
  }
  if (const double fitted = r.per_node > 0 ? r.across_GBps : r.flat_GBps; !(fitted > 0))
    throw UsageError(
        "--fabric-from run fits the links to the grad_sync fixture, which timed nothing here; keep grad_sync in "
        "--phases");
  return fabric_from_run(r);
}

void probe_steps(Run& run, const Timings& t, Probes& p) {
  const BenchConfig& c = run.c;
  Towers& towers = *run.towers;
  const bool activity = (c.layer_times || !run.trace.empty()) && towers.backend(0).name() != "cpu";  // CUPTI
  std::string note;
  const int n = c.layer_times || !c.project_gpus.empty() ? std::max(c.repetitions, 3) : 1;
  const auto steps = run_probed_steps(towers, n, activity, &note, run.feeder.get());
  if (activity && run.root && note != "CUPTI activity records")
    std::cerr << "stepbench: no kernel names in the probed steps: " << note << "\n";
  if (!c.project_gpus.empty()) {
    const int procs = run.group.size();
    p.projection = projection_input(steps, towers, c.run.overlap, procs);
    if (c.fabric_from == "run") p.fabric = fabric_of_this_run(run, t);
    // the check models what the run did, not the fastest of the models: two levels, or Gloo's (MPI's)
    // ring on CPU ranks; NCCL picks its own algorithm per bucket
    if (procs > 1 && c.run.variable_update == VariableUpdate::distributed_all_reduce)
      p.fabric.algorithm = "2-level";
    else if (procs > 1 && c.run.backend == BackendKind::cpu)
      p.fabric.algorithm = "ring";
    // the repetitions' steps, when the step fixture ran; with several processes less their wait for
    // the sync, which the model puts back
    const auto& calls = procs > 1 ? run.step_compute_samples : run.step_samples;
    const std::size_t keep = std::min(calls.size(), static_cast<std::size_t>(std::max(1, c.repetitions)));
    if (keep > 0) {
      p.projection->step_samples.clear();
      for (std::size_t k = calls.size() - keep; k < calls.size(); ++k)
        p.projection->step_samples.insert(p.projection->step_samples.end(), calls[k].begin(), calls[k].end());
      set_measured_step(*p.projection, median(p.projection->step_samples));
    }
    std::vector<std::pair<int, double>> measured;  // the point this run measured
    if (const double ms = timed_step_ms(run, t); ms > 0) measured.emplace_back(run.gpus, ms);
    auto j = projection_json(*p.projection, p.fabric, project(*p.projection, p.fabric, c.project_gpus), measured);
    if (!c.fabric_note.empty()) j["fabric_from"] = c.fabric_note;
    add_json_section(run, t, "projection", j);
  }
  if (c.layer_times) {
    // the measured (or given) peak; the data sheet's where there is none
    const double peak = p.peak.tflops > 0 ? p.peak.tflops
                                          : device_peak_tflops(towers.backend(0).device_name(),
                                                               std::string(to_string(c.run.precision)));
    p.layer_times = summarize_layer_times(steps, towers, peak);
    p.layer_times->activity = note;
    summarize_activity(*p.layer_times, steps, towers);
    add_json_section(run, t, "layer_times", layer_times_json(*p.layer_times));
  }
  if (!run.trace.empty()) write_trace(run, steps, activity, note);
}

}  // namespace

Probes probe(Run& run, const Timings& t, Peak peak) {
  const BenchConfig& c = run.c;
  Probes p;
  p.peak = std::move(peak);
  p.fabric = fabric_of(c);
  if (run.stop.spent()) return p;  // a failed sync: the group answers no collective
  p.stragglers = gather_stragglers(run);
  p.async = gather_async(run);
  if (p.async) add_json_section(run, t, "asynchronous", async_json(run, *p.async));
  if (p.stragglers && p.stragglers->report.valid)
    add_json_section(run, t, "stragglers", stragglers_json(run, *p.stragglers));
  else if (p.stragglers && run.root)
    std::cerr << "stepbench: no straggler report: no timed step of the step fixture to compare the towers in\n";
  const bool late_signal = run.group.allreduce_max(run.stop.local() ? 1.0 : 0.0) > 0;
  const bool wanted = c.layer_times || !run.trace.empty() || !c.project_gpus.empty();
  if (!wanted || late_signal || run.stop.signal() || !run.stop.halted().empty()) return p;
  run.progress.set("probed steps after the timed ones (--layer-times, --trace, --project-gpus)");
  try {
    probe_steps(run, t, p);
    run.progress.clear();
  } catch (const Error& e) {  // the measured rows stay as written; the run's status says it
    run.progress.clear();
    if (run.group.size() > 1) throw;  // the other processes would wait in the probed steps' syncs: end the run
    std::cerr << "stepbench: " << e.what() << "\n";
    p.failed = true;
  }
  return p;
}

}  // namespace stepbench
