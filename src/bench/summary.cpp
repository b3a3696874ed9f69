// The summary after Google Benchmark's table: medians per phase, the step's inside, the gradient
// sync's bandwidths, the input verdict and the peer's ratios.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "bench/input_report.hpp"
#include "bench/report.hpp"
#include "bench/stats.hpp"

namespace stepbench {

void print_summary(const BenchConfig& c, const Towers& t, const SummaryReporter& rep, const std::string& prefix,
                   const PeerResult& peer, const Feeder& feeder, const MemoryReport& memory) {
  auto find = [&](const std::string& phase) -> const std::vector<SummaryReporter::Rep>* {
    auto it = rep.reps.find(prefix + "/" + phase);
    return it == rep.reps.end() ? nullptr : &it->second;
  };
  auto med = [&](const std::vector<SummaryReporter::Rep>& r, const std::string& counter) {
    std::vector<double> v;
    for (const auto& x : r) {
      if (counter.empty()) {
        v.push_back(x.device_ms);
      } else {
        auto it = x.counters.find(counter);
        if (it != x.counters.end()) v.push_back(it->second);
      }
    }
    return median(v);
  };
  const auto* step = find("step");
  const double step_ms = step ? med(*step, "") : NAN;
  const auto& r = c.run;
  const int gpus = t.global_size();
  const std::int64_t images = r.batch_per_tower * gpus;
  const std::int64_t isz = r.model_options.image_size;
  std::cout << fmt::format(
      "\nstepbench summary: {} on {} ({}), {} {} {}, {} x batch {} = {} images per step, "
      "variable update {}\n",
      to_string(r.model), t.backend(0).name(), t.backend(0).device_name(), to_string(r.precision), to_string(r.layout),
      fmt::format("{}x{}", isz, isz), gpus, r.batch_per_tower, images, to_string(r.variable_update));
  std::cout << fmt::format("medians of {} repetitions, device time, after {} warm-up steps\n", c.repetitions, c.warmup);
  // On a GPU the peer times device events as stepbench does, and the host ratio comes beside it.
  const bool peer_device = peer.timing == "cuda events";
  std::cout << fmt::format("{:<24} {:>11} {:>11} {:>11} {:>9} {:>7} {:>11}{}{}\n", "phase", "median ms", "images/s",
                           "host ms", "gap ms", "cv %", "% of step",
                           peer.empty() ? "" : fmt::format(" {:>11} {:>14}", "PyTorch ms", "stepbench/PT"),
                           peer_device ? fmt::format(" {:>11} {:>10}", "PT host ms", "host ratio") : "");
  std::vector<std::string> warnings;
  std::vector<std::string> rows = names_of<Phase>();
  if (feeder.active()) rows.push_back("step:data=" + feeder.name());
  if (c.cuda_graph) {
    rows.emplace_back("forward:cuda_graph");
    rows.emplace_back("step:cuda_graph");
  }
  for (const auto& ph : rows) {
    const auto* r = find(ph);
    if (!r || r->empty()) continue;
    std::vector<double> ms;
    for (const auto& x : *r) ms.push_back(x.device_ms);
    const double m = median(ms), cv = ms.size() > 1 ? 100.0 * stddev(ms) / mean(ms) : 0.0;
    if (cv > 5.0) warnings.push_back(fmt::format("{}: cv {:.1f}% over {} repetitions", ph, cv, ms.size()));
    const bool per_image = ph != "grad_sync" && ph != "update";  // input_pipeline: images delivered per second
    std::string peer_cols;
    if (!peer.empty()) {
      auto it = peer.ms.find(ph);
      peer_cols = it == peer.ms.end() || gpus != 1 ? fmt::format(" {:>11} {:>14}", "-", "-")
                                                   : fmt::format(" {:>11.3f} {:>14.2f}", it->second, m / it->second);
      if (peer_device) {
        auto h = peer.host_ms.find(ph);
        peer_cols += h == peer.host_ms.end() || gpus != 1
                         ? fmt::format(" {:>11} {:>10}", "-", "-")
                         : fmt::format(" {:>11.3f} {:>10.2f}", h->second, med(*r, "host_ms") / h->second);
      }
    }
    std::cout << fmt::format("{:<24} {:>11.3f} {:>11} {:>11.3f} {:>9.3f} {:>7.1f} {:>11}{}\n", ph, m,
                             per_image ? fmt::format("{:.1f}", 1000.0 * static_cast<double>(images) / m) : "-",
                             med(*r, "host_ms"), med(*r, "gap_ms"), cv,
                             std::isnan(step_ms) ? "-" : fmt::format("{:.1f}", 100.0 * m / step_ms), peer_cols);
  }
  if (step) {
    const double f = med(*step, "forward_ms"), b = med(*step, "backward_ms"), s = med(*step, "sync_ms"),
                 u = med(*step, "update_ms");
    std::cout << fmt::format(
        "inside the step: forward {:.3f} ms, backward {:.3f} ms, sync {:.3f} ms, update {:.3f} ms; "
        "backward:forward {:.2f}, sync share {:.1f}% of the step\n",
        f, b, s, u, b / f, 100.0 * s / step_ms);
  }
  if (const auto* fb = find("forward_backward")) {
    const double f = med(*fb, "forward_ms"), b = med(*fb, "backward_ms");
    std::cout << fmt::format("forward_backward alone: forward {:.3f} ms, backward {:.3f} ms, backward:forward {:.2f}\n",
                             f, b, b / f);
  }
  if (const auto* gs = find("grad_sync")) {
    std::cout << fmt::format(
        "grad_sync: {:.1f} MB in {} buckets over {} ({}); algbw {:.2f} GB/s, busbw {:.2f} GB/s; "
        "in the step, overlap with backward {}\n",
        static_cast<double>(t.sync_bytes()) / 1e6, t.bucket_count(), t.sync_name(), to_string(r.variable_update),
        med(*gs, "algbw_GB/s"), med(*gs, "busbw_GB/s"), r.overlap ? "on" : "off");
  } else if (t.sync_bytes() == 0) {
    std::cout << fmt::format("grad_sync: nothing to synchronise ({}), not timed\n",
                             t.global_size() < 2 ? "one tower" : "independent towers");
  }
  std::cout << memory_lines(memory);
  if (feeder.active()) {
    std::cout << "input: " << feeder.describe() << "\n";
    const auto* pipe = find("input_pipeline");
    const auto* fed = find("step:data=" + feeder.name());
    const double S = step ? 1000.0 * static_cast<double>(images) / step_ms : NAN;
    const double P = pipe ? 1000.0 * static_cast<double>(images) / med(*pipe, "") : NAN;
    const double D = fed ? 1000.0 * static_cast<double>(images) / med(*fed, "") : NAN;
    print_input_section(std::cout, c, feeder, S, P, D, std::max(1, t.global_size() / std::max(1, t.size())));
    if (r.backend == BackendKind::cpu)
      std::cout << "note: on the cpu backend the decoding threads share the cores with the model, so the fed step "
                   "is slower than the synthetic one even when the pipeline alone keeps up\n";
    if (const std::string sk = feeder.skipped(); !sk.empty()) std::cout << "input: " << sk << "\n";
  }
  for (const auto& w : warnings)
    std::cout << "WARNING: " << w
              << " (> 5%: the machine is noisy; more --repetitions "
                 "or a quieter machine)\n";
  for (const auto& e : rep.errors) std::cout << "ERROR: " << e << "\n";
  if (c.reduced()) std::cout << "note: " << c.reduced_note << "\n";
}

}  // namespace stepbench
