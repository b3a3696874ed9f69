// The report as text (stdout), markdown (a GitHub job summary) and JSON.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "compare/compare.hpp"

namespace stepbench::compare {
namespace {

std::string pct(double x) { return std::isfinite(x) ? fmt::format("{:+.1f}%", 100 * x) : "-"; }
std::string ms(double x) { return std::isfinite(x) && x > 0 ? fmt::format("{:.3f}", x) : "-"; }
std::string interval(const Row& r) {
  return r.status == Status::insufficient || !std::isfinite(r.ci_lo)
             ? "-"
             : fmt::format("[{}, {}]", pct(r.ci_lo - 1), pct(r.ci_hi - 1));
}
std::string pvalue(const Row& r) { return r.status == Status::insufficient ? "-" : fmt::format("{:.2g}", r.p_slower); }

// Per-layer rows are shown when they moved (a status other than no change); the rest are counted.
bool shown(const Row& r) { return !r.per_layer || (r.status != Status::no_change && r.status != Status::insufficient); }

std::string header(const Report& r) {
  std::size_t phases = 0, layers = 0;
  for (const auto& row : r.rows) (row.per_layer ? layers : phases) += 1;
  return fmt::format(
      "base: {}\nhead: {}\nthreshold {:.1f}%, alpha {:g} (Holm over {} phases{}), {:.0f}% bootstrap intervals of the "
      "median ratio",
      r.base_source, r.head_source, 100 * r.options.threshold, r.options.alpha, phases,
      layers ? fmt::format(" and, apart, {} per-layer benchmarks", layers) : "", 100 * (1 - r.options.alpha));
}

std::string layer_line(const LayerMove& m) {
  return fmt::format("{} {}{}: {} per call, {:+.3f} ms per step ({:.0f}% of the change)", m.key, m.direction,
                     m.label.empty() ? "" : " [" + m.label + "]", pct(m.change), m.delta_ms, 100 * m.share);
}

std::string verdict(const Report& r) {
  int reg = 0, unst = 0, susp = 0, ins = 0, imp = 0;
  for (const auto& row : r.rows) {
    reg += row.status == Status::regression;
    unst += row.status == Status::unstable;
    susp += row.status == Status::suspicious;
    ins += row.status == Status::insufficient;
    imp += row.status == Status::improvement;
  }
  return fmt::format("{}: {} regression{}, {} unstable, {} suspicious, {} improvement{}, {} with insufficient data",
                     reg ? "REGRESSION" : "no regression", reg, reg == 1 ? "" : "s", unst, susp, imp,
                     imp == 1 ? "" : "s", ins);
}

}  // namespace

std::string format_text(const Report& r) {
  std::string s = "stepbench compare\n" + header(r) + "\n";
  for (const auto& n : r.notes) s += "note: " + n + "\n";
  s += fmt::format("{:<64} {:>6} {:>10} {:>10} {:>8} {:>18} {:>9}  {}\n", "benchmark", "n", "base ms", "head ms",
                   "change", "interval", "p slower", "status");
  std::size_t hidden = 0;
  for (const auto& row : r.rows) {
    if (!shown(row)) {
      ++hidden;
      continue;
    }
    s += fmt::format("{:<64} {:>6} {:>10} {:>10} {:>8} {:>18} {:>9}  {}{}\n", row.key,
                     fmt::format("{}/{}", row.n_base, row.n_head), ms(row.base_ms), ms(row.head_ms),
                     row.n_base ? pct(row.change) : "-", interval(row), pvalue(row), to_string(row.status),
                     row.reason.empty() ? "" : " (" + row.reason + ")");
    for (const auto& m : row.layers) s += "    moved: " + layer_line(m) + "\n";
  }
  if (hidden) s += fmt::format("({} per-layer benchmarks without a change not shown)\n", hidden);
  if (const std::string h = r.rerun_hint(); !h.empty()) s += h + "\n";
  return s + verdict(r) + "\n";
}

std::string format_markdown(const Report& r) {
  std::string s = "### stepbench compare: " + verdict(r) + "\n\n";
  std::string h = header(r);
  for (std::size_t p = h.find('\n'); p != std::string::npos; p = h.find('\n', p + 3)) h.replace(p, 1, "  \n");
  s += h + "\n\n";
  for (const auto& n : r.notes) s += "> " + n + "\n\n";
  s += "| benchmark | n base/head | base ms | head ms | change | interval | p slower | status |\n";
  s += "|---|---:|---:|---:|---:|---|---:|---|\n";
  for (const auto& row : r.rows) {
    if (!shown(row)) continue;
    const bool bad = row.status == Status::regression;
    s += fmt::format("| `{}` | {}/{} | {} | {} | {} | {} | {} | {}{}{}{} |\n", row.key, row.n_base, row.n_head,
                     ms(row.base_ms), ms(row.head_ms), row.n_base ? pct(row.change) : "-", interval(row), pvalue(row),
                     bad ? "**" : "", to_string(row.status), bad ? "**" : "",
                     row.reason.empty() ? "" : ": " + row.reason);
  }
  if (const std::string h = r.rerun_hint(); !h.empty()) s += "\n" + h + "\n";
  for (const auto& row : r.rows) {
    if (row.layers.empty()) continue;
    s += fmt::format("\n**What moved in `{}`** (per-layer benchmarks, change x layers of that shape):\n\n", row.key);
    for (const auto& m : row.layers) s += "- " + layer_line(m) + "\n";
  }
  return s;
}

std::string format_json(const Report& r) {
  nlohmann::json j;
  j["base"] = r.base_source;
  j["head"] = r.head_source;
  j["threshold"] = r.options.threshold;
  j["alpha"] = r.options.alpha;
  j["notes"] = r.notes;
  j["regression"] = r.exit_code() == 1;
  j["rerun"] = r.rerun_hint();
  auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  for (const auto& row : r.rows) {
    nlohmann::json b = {{"benchmark", row.key},
                        {"status", to_string(row.status)},
                        {"reason", row.reason},
                        {"per_layer", row.per_layer},
                        {"n_base", row.n_base},
                        {"n_head", row.n_head},
                        {"base_median_ms", num(row.base_ms)},
                        {"head_median_ms", num(row.head_ms)},
                        {"change", num(row.change)},
                        {"ratio_interval", {num(row.ci_lo), num(row.ci_hi)}},
                        {"p_slower_holm", num(row.p_slower)},
                        {"p_faster_holm", num(row.p_faster)},
                        {"noise_floor", num(row.noise)},
                        {"throttled_base", row.throttled_base},
                        {"throttled_head", row.throttled_head}};
    for (const auto& m : row.layers)
      b["layers_moved"].push_back({{"shape", m.key},
                                   {"layers", m.label},
                                   {"direction", m.direction},
                                   {"change", m.change},
                                   {"delta_ms_per_step", m.delta_ms},
                                   {"share", m.share}});
    j["benchmarks"].push_back(b);
  }
  return j.dump(2) + "\n";
}

}  // namespace stepbench::compare
