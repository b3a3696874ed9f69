// The fabric a projection assumes, nccl-tests' fit, and the straggler tax (fabric.hpp).
#include "bench/fabric.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include "bench/stats.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

struct AlphaBeta {
  double alpha, beta;  // ms per hop, bytes per ms
};
AlphaBeta of(const LinkModel& l) { return {l.latency_us / 1e3, l.gbps * 1e9 / 8 / 1e3}; }

double ring(const AlphaBeta& l, double s, double n) { return 2 * (n - 1) * (l.alpha + s / (n * l.beta)); }
double tree(const AlphaBeta& l, double s, double n) { return 2 * std::ceil(std::log2(n)) * l.alpha + 2 * s / l.beta; }

// The quantile of the standard normal distribution (bisection on erfc: plenty for a projection).
double normal_quantile(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

}  // namespace

Fabric fabric_of(const BenchConfig& c) {
  return {{c.fabric.empty() ? "given" : c.fabric, c.link_gbps, c.link_latency_us},
          {c.node_fabric.empty() ? "given" : c.node_fabric, c.node_link_gbps, c.node_link_latency_us},
          c.gpus_per_node,
          ""};
}

std::string describe(const Fabric& f) {
  const auto link = [](const LinkModel& l) {
    return fmt::format("{} ({:g} Gb/s, {:g} us per hop)", l.name == "given" ? "the given link" : l.name, l.gbps,
                       l.latency_us);
  };
  if (f.gpus_per_node <= 0) return link(f.between);
  return fmt::format("{} GPUs per node over {}, then {} between nodes", f.gpus_per_node, link(f.node), link(f.between));
}

double allreduce_ms(const Fabric& f, double bytes, int gpus, std::string* algorithm) {
  if (gpus < 2) {
    if (algorithm) *algorithm = "none";
    return 0;
  }
  const double n = gpus;
  const bool two_levels = f.gpus_per_node > 0;
  const int g = two_levels ? std::min(f.gpus_per_node, gpus) : gpus;
  const int nodes = (gpus + g - 1) / g;
  // one node: everything over its link; a flat fabric: over the one link
  const AlphaBeta flat = of(two_levels && nodes == 1 ? f.node : f.between);
  // the hierarchical one: a reduce-scatter and an all-gather within each node, each GPU's share
  // all-reduced between the nodes (nothing between one node's GPUs)
  const auto hierarchical = [&] {
    const AlphaBeta in = of(f.node), out = of(f.between);
    const double share = bytes / g;
    const double within = g > 1 ? 2 * (g - 1) * (in.alpha + share / in.beta) : 0;
    return within + (nodes > 1 ? std::min(ring(out, share, nodes), tree(out, share, nodes)) : 0);
  };
  double best = 0;
  std::string name;
  if (f.algorithm == "ring") {
    best = ring(flat, bytes, n), name = "ring";
  } else if (f.algorithm == "2-level" && two_levels) {
    best = hierarchical(), name = "2-level";
  } else {
    best = ring(flat, bytes, n), name = "ring";
    if (const double t = tree(flat, bytes, n); t < best) best = t, name = "tree";
    if (two_levels && nodes > 1)
      if (const double t = hierarchical(); t < best) best = t, name = "2-level";
  }
  if (algorithm) *algorithm = name;
  return best;
}

Fabric fabric_from_run(const RunLinks& r) {
  const auto link = [](double gb_per_s) { return LinkModel{"this run's grad_sync", gb_per_s * 8, 0}; };
  Fabric f;
  if (r.per_node <= 0) {
    f.between = link(r.flat_GBps);
    f.algorithm = "ring";
    return f;
  }
  f.gpus_per_node = r.per_node;
  f.algorithm = "2-level";
  f.between = link(r.across_GBps);
  // the model's 2 (G-1) s / (G beta) within a node is the reduce-scatter's time plus the all-gather's,
  // each (G-1) s / (G busbw): beta is their busbws' harmonic mean. One process per node: no such link
  const bool inside = r.per_node > 1 && r.node_reduce_scatter_GBps > 0 && r.node_all_gather_GBps > 0;
  f.node = link(inside ? 2 / (1 / r.node_reduce_scatter_GBps + 1 / r.node_all_gather_GBps) : r.across_GBps);
  return f;
}

FittedLink fit_nccl_tests(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("--fabric-from {}: cannot read it", path));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(
        fmt::format("--fabric-from {}: not JSON ({}); give the file nccl-tests' all_reduce_perf wrote "
                    "with -J FILE.json",
                    path, e.what()));
  }
  const auto bad = [&](const std::string& what) {
    return UsageError(
        fmt::format("--fabric-from {}: {}; give the file nccl-tests' all_reduce_perf wrote with -J", path, what));
  };
  if (!j.is_object() || !j.contains("results") || !j["results"].is_array()) throw bad("no \"results\" list");
  const nlohmann::json* devices = nullptr;
  if (j.contains("config") && j["config"].contains("devices")) devices = &j["config"]["devices"];
  if (!devices && j.contains("devices")) devices = &j["devices"];
  if (!devices || !devices->is_array() || devices->empty()) throw bad("no \"devices\" list (the ranks)");
  FittedLink f;
  std::set<std::string> hosts;
  for (const auto& d : *devices) {
    if (!d.is_object()) throw bad("a \"devices\" entry that is not an object");
    hosts.insert(d.contains("hostname") && d["hostname"].is_string() ? d["hostname"].get<std::string>() : "?");
  }
  f.ranks = static_cast<int>(devices->size());
  f.hosts = static_cast<int>(hosts.size());
  if (f.ranks < 2) throw bad("one rank: an all-reduce over one GPU moves nothing");
  std::vector<std::pair<double, double>> pts;  // bytes, ms
  for (const auto& r : j["results"]) {
    for (const char* place : {"out_of_place", "in_place"}) {
      if (!r.is_object() || !r.contains(place) || !r[place].is_object() || !r.contains("size") ||
          !r["size"].is_number())
        continue;
      const auto& p = r[place];
      const double t = p.contains("time") && p["time"].is_number() ? p["time"].get<double>() : 0;
      if (t > 0) {
        pts.emplace_back(r["size"].get<double>(), t / 1e3);
        break;
      }
    }
  }
  if (pts.size() < 2) throw bad("fewer than two sizes with a time");
  // least squares on relative error: weights 1 / t^2
  double sw = 0, ss = 0, sss = 0, st = 0, sst = 0;
  for (const auto& [s, t] : pts) {
    const double w = 1 / (t * t);
    sw += w, ss += w * s, sss += w * s * s, st += w * t, sst += w * s * t;
  }
  const double det = sw * sss - ss * ss;
  double a = det != 0 ? (st * sss - ss * sst) / det : 0, b = det != 0 ? (sw * sst - ss * st) / det : 0;
  if (a < 0) a = 0, b = sst / sss;
  if (!(b > 0)) throw bad("its times do not grow with the size");
  for (const auto& [s, t] : pts) f.worst_residual = std::max(f.worst_residual, std::abs(a + b * s - t) / t);
  const double n = f.ranks;
  f.link.name = path;
  f.link.latency_us = a / (2 * (n - 1)) * 1e3;
  f.link.gbps = 2 * (n - 1) / (n * b) * 1e3 * 8 / 1e9;
  f.points = static_cast<int>(pts.size());
  f.note = fmt::format(
      "{}: all-reduce over {} ranks on {} host{} (nccl-tests{}): alpha {:.2f} us, beta {:.1f} GB/s, fitted to {} sizes "
      "(worst misfit {:.0f}%)",
      path, f.ranks, f.hosts, f.hosts == 1 ? "" : "s",
      j.contains("nccl_version")
          ? fmt::format(", NCCL {}",
                        j["nccl_version"].is_string() ? j["nccl_version"].get<std::string>() : j["nccl_version"].dump())
          : "",
      f.link.latency_us, f.link.gbps / 8, f.points, 100 * f.worst_residual);
  return f;
}

StragglerTax straggler_tax(const std::vector<double>& samples, int gpus) {
  StragglerTax tax;
  if (gpus < 2 || samples.size() < 3) return tax;
  const double m = median(samples), k = static_cast<double>(samples.size());
  std::vector<double> dev;
  double mean = 0, sq = 0;
  for (double v : samples) dev.push_back(std::abs(v - m)), mean += v / k;
  for (double v : samples) sq += (v - mean) * (v - mean);
  const double robust = 1.4826 * median(dev), plain = std::sqrt(sq / (k - 1));
  const double err = 1.96 / std::sqrt(2 * (k - 1));  // a standard deviation's relative sampling error
  const double n = gpus, q = normal_quantile((n - 0.375) / (n + 0.25));  // Blom: E[max of n] of N(0, 1)
  tax.lo_ms = std::max(0.0, robust * (1 - err) * q);
  tax.hi_ms = std::max(robust, plain) * (1 + err) * q;
  return tax;
}

}  // namespace stepbench
