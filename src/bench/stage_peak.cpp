// The run's measure_peak stage (stages.hpp): the device's GEMM peak for the run's precision, from
// --peak, the cache or measured here (peak.hpp), on the root process once the fixtures are done,
// and --json's "peak": the step's and the forward's model FLOP/s per device as a share of it.
#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

#include "bench/stats.hpp"

#include "bench/stages.hpp"

namespace stepbench {

double phase_tflops_per_device(const Run& run, const Timings& t, const std::string& phase) {
  const auto it = t.reporter->reps.find(run.prefix + "/" + phase);
  std::vector<double> ms;
  if (it != t.reporter->reps.end())
    for (const auto& r : it->second) ms.push_back(r.device_ms);
  if (ms.empty()) return NAN;
  const double flop_per_image = phase == "step" ? 3.0 * run.flops.train_forward : run.flops.forward;
  // GPUs each run their towers at once; CPU towers take turns on one process's threads. Asynchronous
  // workers' rows are this process's towers' images (stage_set_up), the synchronous rows every one's.
  const bool cpu = run.towers->backend(0).kind() == DeviceKind::cpu, own = run.towers->asynchronous();
  const double devices = cpu ? (own ? 1 : run.group.size()) : (own ? run.towers->size() : run.gpus);
  return run.images * flop_per_image / (median(ms) * 1e9) / devices;
}

Peak measure_peak(Run& run, const Timings& t) {
  if (!run.root || run.stop.spent() || run.c.sweep()) return {};
  run.resident_timed = resident_memory();  // the GEMM's own buffers stay out of the step's memory report
  Backend& b = run.towers->backend(0);
  const Precision p = run.c.run.precision;
  Peak pk;
  try {
    pk = resolve_peak(b, p, run.c.peak);
  } catch (const Error& e) {  // out of memory on a full device, a library's failure: the run stands
    pk.note = fmt::format("not measured: {}", e.what());
  }
  if (!pk.note.empty() && pk.tflops <= 0 && run.c.peak.mode != PeakMode::off)
    std::cerr << "stepbench: the device's peak: " << pk.note << "\n";
  if (const double sheet = device_peak_tflops(b.device_name(), std::string(to_string(p))); sheet > 0)
    pk.how += fmt::format("{}the data sheet's dense peak: {} TFLOP/s", pk.how.empty() ? "" : "; ", sheet);
  add_json_section(run, t, "peak",
                   peak_json(pk, phase_tflops_per_device(run, t, "step"), phase_tflops_per_device(run, t, "forward")));
  return pk;
}

std::string peak_answer(const Run& run, const Timings& t, const Peak& pk) {
  if (run.c.peak.mode == PeakMode::off) return "";
  const double step = phase_tflops_per_device(run, t, "step"), fwd = phase_tflops_per_device(run, t, "forward");
  if (std::isnan(step) && std::isnan(fwd)) return "";
  const bool cpu = run.towers->backend(0).kind() == DeviceKind::cpu;
  const std::string per = cpu ? (run.group.size() > 1 ? " a process" : "") : (run.gpus > 1 ? " a GPU" : "");
  std::vector<std::string> parts;
  for (const auto& [name, v] : {std::pair<const char*, double>{"step", step}, {"forward", fwd}}) {
    if (std::isnan(v)) continue;
    const std::string rate = fmt::format("{:.3g} TFLOP/s{}", v, parts.empty() ? per : "");
    parts.push_back(pk.tflops > 0 ? fmt::format("{} {:.1f}% ({})", name, 100.0 * v / pk.tflops, rate)
                                  : fmt::format("{} {}", name, rate));
  }
  const std::string flops = fmt::format("model FLOPs, {:.3g} GFLOP an image a step, backward twice the forward",
                                        3.0 * run.flops.train_forward / 1e9);
  if (pk.tflops <= 0) return fmt::format("{} ({}); the peak is unknown: {}", fmt::join(parts, ", "), flops, pk.note);
  std::string where;
  if (pk.source == "given")
    where = fmt::format("{:.4g} TFLOP/s as given (--peak)", pk.tflops);
  else if (pk.source == "cached")
    where = fmt::format("the {} GEMM's {:.3g} TFLOP/s, measured here on {} (--peak measure: again)",
                        to_string(run.c.run.precision), pk.tflops, pk.measured_at);
  else
    where = fmt::format("the {} GEMM's {:.3g} TFLOP/s, measured now{}", to_string(run.c.run.precision), pk.tflops,
                        pk.file.empty() ? " (not cached)" : ", cached in " + pk.file);
  return fmt::format("{} of {}; {}", fmt::join(parts, ", "), where, flops);
}

}  // namespace stepbench
