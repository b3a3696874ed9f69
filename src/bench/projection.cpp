// --project-gpus (projection.hpp).
#include "bench/projection.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>

#include "bench/fabric.hpp"
#include "bench/stats.hpp"
#include "bench/text.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

struct Preset {
  const char* name;
  double gbps, latency_us;
};
// Nominal per-GPU, one-direction figures: what a data sheet says, not what NCCL reaches.
constexpr Preset kFabrics[] = {{"nvlink4", 3600, 3},  // H100 NVLink: 450 GB/s each way
                               {"nvlink3", 2400, 3},  // A100 NVLink: 300 GB/s each way
                               {"ib-ndr", 400, 5},
                               {"ib-hdr", 200, 5},
                               {"eth-100", 100, 10}};

}  // namespace

LinkModel fabric_preset(const std::string& name) {
  for (const auto& f : kFabrics)
    if (name == f.name) return {f.name, f.gbps, f.latency_us};
  return {};
}
std::vector<std::string> fabric_names() {
  std::vector<std::string> v;
  for (const auto& f : kFabrics) v.emplace_back(f.name);
  return v;
}

ProjectionInput projection_input(const std::vector<ProbedStep>& steps, const Towers& t, bool overlap, int processes) {
  ProjectionInput in;
  in.processes = processes;
  in.sequential = processes == 1 && t.backend(0).name() == "cpu";  // processes run side by side
  const auto layers = t.graph(0).layers();
  std::map<std::string, std::vector<double>> phase;
  std::vector<std::vector<double>> end_of(layers.size());  // per layer: its backward's end after backward's start
  for (const auto& st : steps) {
    const auto& v = st.towers.at(0);
    double b0 = 0;
    for (const auto& s : v) {
      if (s.layer != ProbeSpan::kPhase) continue;
      phase[s.part].push_back(s.dev1 - s.dev0);
      if (std::string(s.part) == "backward") b0 = s.dev0;
    }
    std::vector<double> end(layers.size(), -1);
    for (const auto& s : v)
      if (s.layer >= 0 && std::string(s.phase) == "backward")
        end[static_cast<std::size_t>(s.layer)] = std::max(end[static_cast<std::size_t>(s.layer)], s.dev1 - b0);
    for (std::size_t i = 0; i < layers.size(); ++i)
      if (end[i] >= 0) end_of[i].push_back(end[i]);
  }
  auto med = [&](const char* p) { return phase.count(p) ? median(phase[p]) : 0.0; };
  in.forward_ms = med("forward");
  in.backward_ms = med("backward");
  in.update_ms = med("update");
  if (phase.count("step")) {  // the band's spread and one GPU's step (a run's timed steps replace both)
    in.step_samples = phase["step"];
    // several processes: each step less its wait for the sync, which the model puts back
    if (processes > 1) {  // (a run's timed steps less their sync replace these, bench/stage_probe.cpp)
      SB_CHECK(phase["grad_sync"].size() == in.step_samples.size(), "a probed step without its grad_sync");
      for (std::size_t k = 0; k < in.step_samples.size(); ++k) in.step_samples[k] -= phase["grad_sync"][k];
    }
    in.step_ms = median(in.step_samples);
  }
  // bucket k is ready once the first layer in backward order whose prefix covers it has run
  for (const auto& [off, count] : t.buckets()) {
    double ready = in.backward_ms;
    for (std::size_t i = layers.size(); overlap && i-- > 0;) {
      if (end_of[i].empty() || layers[i].ready_after < off + count) continue;
      ready = median(end_of[i]);
      break;
    }
    in.buckets.push_back({ready, static_cast<double>(count * sizeof(float))});
  }
  return in;
}

void set_measured_step(ProjectionInput& in, double step_ms) { in.step_ms = step_ms; }

std::vector<ProjectedPoint> project(const ProjectionInput& in, const Fabric& fabric, const std::vector<int>& gpus) {
  const LinkModel& link = fabric.between;
  const double alpha = link.latency_us / 1e3;     // ms
  const double beta = link.gbps * 1e9 / 8 / 1e3;  // bytes per ms
  const double base = in.base_ms();
  std::vector<ProjectedPoint> out;
  for (int g : gpus) {
    ProjectedPoint p;
    p.gpus = g;
    const double n = g;
    double end = 0, sync = 0;
    std::vector<std::string> used;  // the algorithms the buckets took, in first use
    if (g > 1) {
      for (const auto& b : in.buckets) {
        double t = 0;
        if (in.sequential) {
          t = alpha + 2 * (n - 1) * b.bytes / beta;
        } else {
          std::string a;
          t = allreduce_ms(fabric, b.bytes, g, &a);
          if (std::find(used.begin(), used.end(), a) == used.end()) used.push_back(a);
        }
        end = std::max(end, b.ready_ms) + t;
        sync += t;
      }
    }
    p.sync_ms = sync;
    p.exposed_ms = std::max(0.0, end - in.backward_ms);
    std::sort(used.begin(), used.end(), [](const std::string& x, const std::string& y) {
      const auto rank = [](const std::string& v) { return v == "ring" ? 0 : v == "tree" ? 1 : 2; };
      return rank(x) < rank(y);
    });
    std::string joined;
    for (const auto& a : used) joined += (joined.empty() ? "" : "+") + a;
    p.algorithm = g == 1 ? "none" : in.sequential ? "host" : joined;
    p.step_ms = (in.sequential ? n * base : base) + p.exposed_ms;
    if (!in.sequential && g > 1 && in.step_samples.size() >= 2) {
      const StragglerTax tax = straggler_tax(in.step_samples, g);
      p.tax_lo_ms = tax.lo_ms;
      p.tax_hi_ms = tax.hi_ms;
    }
    // images/s at N over N times one GPU's, (N b / step) / (N b / base): one GPU's step over N's
    p.efficiency = base / p.step_ms;
    out.push_back(p);
  }
  return out;
}

void print_projection(const ProjectionInput& in, const Fabric& fabric, const std::vector<ProjectedPoint>& pts,
                      const std::vector<std::pair<int, double>>& measured, std::int64_t batch) {
  double bytes = 0;
  for (const auto& b : in.buckets) bytes += b.bytes;
  const std::string from =
      in.processes > 1
          ? fmt::format(
                "projection checked against this run of {} processes, one tower each, as {} GPUs: from "
                "process 0's compute, {:.3f} ms a step (its steps less their wait for the sync; in the probed steps",
                in.processes, in.processes, in.base_ms())
          : fmt::format("projection from one GPU's measured step, {:.3f} ms (in the probed steps", in.base_ms());
  std::cout << "\n"
            << wrap(fmt::format("{}; forward {:.3f} ms, backward {:.3f} ms, update {:.3f} ms; {} buckets, {:.1f} MB "
                                "of gradients) over {}{}, batch {} per GPU:",
                                from, in.forward_ms, in.backward_ms, in.update_ms, in.buckets.size(), bytes / 1e6,
                                describe(fabric),
                                fabric.algorithm.empty() ? "" : fmt::format(", {} as the run did", fabric.algorithm),
                                batch),
                    2);
  const bool band = std::any_of(pts.begin(), pts.end(), [](const ProjectedPoint& p) { return p.tax_hi_ms > 0; });
  std::cout << fmt::format("{:>6} {:>10}{} {:>9} {:>10} {:>8} {:>17} {:>11} {:>8}\n", "gpus", "step ms",
                           band ? fmt::format(" {:>15}", "+stragglers ms") : "", "sync ms", "exposed ms", "effic.",
                           "algorithm", "measured ms", "error");
  for (const auto& p : pts) {
    double m = 0;
    for (const auto& [g, ms] : measured)
      if (g == p.gpus) m = ms;
    const std::string tax =
        !band ? ""
              : fmt::format(" {:>15}", p.tax_hi_ms > 0 ? fmt::format("{:.3f}..{:.3f}", p.tax_lo_ms, p.tax_hi_ms) : "-");
    std::cout << fmt::format("{:>6} {:>10.3f}{} {:>9.3f} {:>10.3f} {:>7.1f}% {:>17} {:>11} {:>8}\n", p.gpus, p.step_ms,
                             tax, p.sync_ms, p.exposed_ms, 100 * p.efficiency, p.algorithm,
                             m > 0 ? fmt::format("{:.3f}", m) : "-",
                             m > 0 ? fmt::format("{:+.1f}%", 100 * (p.step_ms / m - 1)) : "-");
  }
  if (std::none_of(pts.begin(), pts.end(), [&](const ProjectedPoint& p) {
        return std::any_of(measured.begin(), measured.end(), [&](const auto& m) { return m.first == p.gpus; });
      }))
    std::cout << "(no count projected is one this run measured: no error to show; add it to --project-gpus)\n";
  std::cout << wrap(
      in.sequential
          ? "assumptions: cpu towers in one process run one after another (N x one tower's step); "
            "each bucket sums in host memory, alpha + 2 (N-1) s / beta, overlapping the last tower's backward "
            "from when it is ready"
          : fmt::format("assumptions: weak scaling (batch per GPU fixed), the per-GPU compute measured here; "
                        "buckets one after another on one channel from when backward produced them, overlapping the "
                        "rest of backward; per bucket {}; no congestion.{}",
                        fabric.algorithm == "ring" ? "the ring, 2(N-1)(alpha + s/(N beta))"
                        : fabric.algorithm == "2-level"
                            ? "two levels: reduce-scatter and all-gather within each node, 2(G-1)(alpha + s/(G "
                              "beta)), and the ring of each GPU's share between the nodes"
                            : fmt::format("the fastest of NCCL's ring, 2(N-1)(alpha + s/(N beta)), and tree, 2 "
                                          "ceil(log2 N) alpha + 2 s/beta{}",
                                          fabric.gpus_per_node > 0
                                              ? ", and the two-level one (reduce-scatter and all-gather within each "
                                                "node, the all-reduce of each GPU's share between the nodes)"
                                              : ", over one flat fabric"),
                        band
                            ? fmt::format(" +stragglers: the expected slowest of N GPUs' steps spread like this "
                                          "run's {} steps (normal tails, from the robust spread to the full one), over "
                                          "their median: add it to the step",
                                          in.step_samples.size())
                            : ""),
      2);
}

nlohmann::json projection_json(const ProjectionInput& in, const Fabric& fabric, const std::vector<ProjectedPoint>& pts,
                               const std::vector<std::pair<int, double>>& measured) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& p : pts) {
    rows.push_back({{"gpus", p.gpus},
                    {"step_ms", p.step_ms},
                    {"sync_ms", p.sync_ms},
                    {"exposed_sync_ms", p.exposed_ms},
                    {"scaling_efficiency", p.efficiency},
                    {"algorithm", p.algorithm},
                    {"straggler_band_ms", {p.tax_lo_ms, p.tax_hi_ms}}});
    for (const auto& [g, ms] : measured)
      if (g == p.gpus && ms > 0) {
        rows.back()["measured_step_ms"] = ms;
        rows.back()["error"] = p.step_ms / ms - 1;
      }
  }
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& b : in.buckets) buckets.push_back({{"ready_ms", b.ready_ms}, {"bytes", b.bytes}});
  const auto link = [](const LinkModel& l) {
    return nlohmann::json{{"name", l.name}, {"gbps", l.gbps}, {"latency_us", l.latency_us}};
  };
  nlohmann::json j{{"link", link(fabric.between)},
                   {"forward_ms", in.forward_ms},
                   {"backward_ms", in.backward_ms},
                   {"update_ms", in.update_ms},
                   {"one_gpu_step_ms", in.base_ms()},
                   {"towers_one_after_another", in.sequential},
                   {"processes", in.processes},
                   {"buckets", buckets},
                   {"step_samples", in.step_samples.size()},
                   {"points", rows}};
  if (!fabric.algorithm.empty()) j["algorithm"] = fabric.algorithm;
  if (fabric.gpus_per_node > 0) {
    j["gpus_per_node"] = fabric.gpus_per_node;
    j["node_link"] = link(fabric.node);
  }
  return j;
}

}  // namespace stepbench
