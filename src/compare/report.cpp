// The report as text (stdout), markdown (a GitHub job summary) and JSON.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

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

// Per-layer rows are shown when they moved (a status other than no change); the rest are counted.
bool shown(const Row& r) { return !r.per_layer || (r.status != Status::no_change && r.status != Status::insufficient); }

// The part of the benchmark names every row shares (up to a '/'), shown once in the header; rows
// are named by the rest (the phase, or the layer and direction).
std::string common_prefix(const Report& r) {
  if (r.rows.empty()) return "";
  std::string p = r.rows.front().key;
  for (const auto& row : r.rows) {
    std::size_t n = 0;
    while (n < p.size() && n < row.key.size() && p[n] == row.key[n]) ++n;
    p.resize(n);
  }
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? "" : p.substr(0, slash + 1);
}

std::string evidence_line(const Report& r) {
  std::size_t phases = 0, layers = 0;
  std::string evidence = "runs";
  for (const auto& row : r.rows) {
    (row.per_layer ? layers : phases) += 1;
    evidence = row.evidence.empty() ? evidence : row.evidence;
  }
  const std::string how =
      evidence == "rounds"    ? "interleaved rounds, each paired with the other side's in its time slot (signed-rank "
                                "test over the rounds)"
      : evidence == "history" ? "HEAD against the earlier runs' medians since their last change (prediction interval)"
                              : "two lone runs: their medians must differ by more than runs differ by chance";
  return fmt::format("evidence: {}; threshold {:.1f}%, alpha {:g} (Holm over {} phases{})", how,
                     100 * r.options.threshold, r.options.alpha, phases,
                     layers ? fmt::format("; apart, {} per-layer benchmarks", layers) : "");
}

std::string layer_line(const LayerMove& m) {
  return fmt::format("{} {}{}: {} per call, {:+.3f} ms per step ({:.0f}% of the change)", m.key, m.direction,
                     m.label.empty() ? "" : " [" + m.label + "]", pct(m.change), m.delta_ms, 100 * m.share);
}

std::string verdict(const Report& r) {
  int reg = 0, unst = 0, unk = 0, ins = 0, imp = 0, same = 0, layer_reg = 0;
  for (const auto& row : r.rows) {
    if (row.per_layer) {
      layer_reg += row.status == Status::regression;
      continue;
    }
    reg += row.status == Status::regression;
    unst += row.status == Status::unstable;
    unk += row.status == Status::unknown;
    ins += row.status == Status::insufficient;
    imp += row.status == Status::improvement;
    same += row.status == Status::no_change;
  }
  std::vector<std::string> parts;
  auto add = [&](int n, const char* what) {
    if (n) parts.push_back(fmt::format("{} {}", n, what));
  };
  add(reg, reg == 1 ? "regression" : "regressions");
  add(unst, "unstable");
  add(imp, imp == 1 ? "improvement" : "improvements");
  add(same, "no change");
  add(unk, "unknown");
  add(ins, "insufficient data");
  const std::string phases = fmt::format("{} (phases)", fmt::join(parts, ", "));
  const std::string layers =
      layer_reg ? fmt::format("; {} per-layer regression{}", layer_reg, layer_reg == 1 ? "" : "s") : "";
  const char* head = reg || layer_reg                              ? "REGRESSION"
                     : ((unk || ins) && r.options.fail_on_unknown) ? "UNKNOWN (--fail-on-unknown)"
                     : unk && !reg && !imp && !same && !unst       ? "no regression found, undecided"
                                                                   : "no regression";
  return fmt::format("{}: {}{}", head, phases, layers);
}

// Words wrapped at `width` columns, the first line indented by `first` spaces, the others by `indent`.
std::string wrap_words(const std::string& text, std::size_t indent, std::size_t width, std::size_t first) {
  std::string out(first, ' '), word;
  std::size_t col = first;
  bool started = false;  // the current line has a word
  auto flush = [&] {
    if (word.empty()) return;
    if (started && col + 1 + word.size() > width) {
      out += '\n';
      out.append(indent, ' ');
      col = indent;
    } else if (started) {
      out += ' ';
      ++col;
    }
    out += word;
    col += word.size();
    started = true;
    word.clear();
  };
  for (char c : text) {
    if (c == ' ') {
      flush();
    } else {
      word += c;
    }
  }
  flush();
  out += '\n';
  return out;
}

std::string mdc_text(const Row& r) {
  return r.status == Status::insufficient || !(r.mdc > 0) ? "-" : fmt::format("±{:.1f}%", 100 * r.mdc);
}

constexpr std::size_t kWidth = 100;

}  // namespace

std::string format_text(const Report& r) {
  const std::string prefix = common_prefix(r);
  std::string s = "stepbench compare: " + verdict(r) + "\n";
  s += wrap_words("base: " + r.base_source, 6, kWidth, 0) + wrap_words("head: " + r.head_source, 6, kWidth, 0);
  if (!prefix.empty()) s += wrap_words("benchmarks: " + prefix + "...", 12, kWidth, 0);
  s += wrap_words(evidence_line(r), 0, kWidth, 0);
  for (const auto& n : r.notes) s += wrap_words("note: " + n, 0, kWidth, 0);
  constexpr std::size_t name_w = 24;
  s += fmt::format("{:<12} {:<{}} {:>9} {:>9} {:>7} {:>18} {:>9}\n", "verdict", "benchmark", name_w, "base ms",
                   "head ms", "change", "interval", "can show");
  std::size_t hidden = 0;
  std::string said;  // the reason printed last: a row with the same one says nothing more
  for (const auto& row : r.rows) {
    if (!shown(row)) {
      ++hidden;
      continue;
    }
    const std::string name = row.key.substr(prefix.size());
    if (name.size() > name_w) s += fmt::format("{:<12} {}\n", to_string(row.status), name);
    s +=
        fmt::format("{:<12} {:<{}} {:>9} {:>9} {:>7} {:>18} {:>9}\n", name.size() > name_w ? "" : to_string(row.status),
                    name.size() > name_w ? "" : name, name_w, ms(row.base_ms), ms(row.head_ms),
                    row.n_base ? pct(row.change) : "-", interval(row), mdc_text(row));
    if (!row.reason.empty() && row.reason != said) s += wrap_words(row.reason, 4, kWidth, 4);
    said = row.reason.empty() ? said : row.reason;
    for (const auto& m : row.layers) s += wrap_words("moved: " + layer_line(m), 4, kWidth, 4);
  }
  if (hidden) s += fmt::format("({} per-layer benchmarks without a change not shown)\n", hidden);
  for (const auto& c : r.changes)
    s += wrap_words(fmt::format("change point: {} {:+.1f}% [{:+.1f}%, {:+.1f}%] from run {} ({}{}), p {:.2g}",
                                c.key.substr(prefix.size()), 100 * c.change, 100 * c.lo, 100 * c.hi, c.run + 1,
                                c.revision, c.time.empty() ? "" : ", " + c.time, c.p),
                    2, kWidth, 0);
  if (const std::string h = r.rerun_hint(); !h.empty()) s += wrap_words(h, 0, kWidth, 0);
  return s;
}

std::string format_markdown(const Report& r) {
  const std::string prefix = common_prefix(r);
  std::string s = "### stepbench compare: " + verdict(r) + "\n\n";
  s += "base: " + r.base_source + "  \nhead: " + r.head_source + "  \n";
  if (!prefix.empty()) s += "benchmarks: `" + prefix + "...`  \n";
  s += evidence_line(r) + "\n\n";
  for (const auto& n : r.notes) s += "> " + n + "\n\n";
  s += "| verdict | benchmark | base ms | head ms | change | interval | can show | why |\n";
  s += "|---|---|---:|---:|---:|---|---:|---|\n";
  for (const auto& row : r.rows) {
    if (!shown(row)) continue;
    const bool bad = row.status == Status::regression;
    s += fmt::format("| {}{}{} | `{}` | {} | {} | {} | {} | {} | {} |\n", bad ? "**" : "", to_string(row.status),
                     bad ? "**" : "", row.key.substr(prefix.size()), ms(row.base_ms), ms(row.head_ms),
                     row.n_base ? pct(row.change) : "-", interval(row), mdc_text(row), row.reason);
  }
  for (const auto& c : r.changes)
    s += fmt::format("\nchange point: `{}` {:+.1f}% [{:+.1f}%, {:+.1f}%] from run {} ({}{}), p {:.2g}\n",
                     c.key.substr(prefix.size()), 100 * c.change, 100 * c.lo, 100 * c.hi, c.run + 1, c.revision,
                     c.time.empty() ? "" : ", " + c.time, c.p);
  if (const std::string h = r.rerun_hint(); !h.empty()) s += "\n" + h + "\n";
  for (const auto& row : r.rows) {
    if (row.layers.empty()) continue;
    s += fmt::format("\n**What moved in `{}`** (per-layer benchmarks, change x layers of that shape):\n\n",
                     row.key.substr(prefix.size()));
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
  j["regression"] =
      std::any_of(r.rows.begin(), r.rows.end(), [](const Row& x) { return x.status == Status::regression; });
  j["unknown"] = std::any_of(r.rows.begin(), r.rows.end(),
                             [](const Row& x) { return !x.per_layer && x.status == Status::unknown; });
  j["exit_code"] = r.exit_code();
  j["fail_on_unknown"] = r.options.fail_on_unknown;
  j["history"] = nlohmann::json::array();  // the runs a change point's "run" indexes, then HEAD
  for (const auto& h : r.history) j["history"].push_back({{"revision", h.revision}, {"time", h.time}});
  j["changes"] = nlohmann::json::array();
  for (const auto& c : r.changes)
    j["changes"].push_back({{"benchmark", c.key},
                            {"run", c.run},
                            {"revision", c.revision},
                            {"time", c.time},
                            {"change", c.change},
                            {"interval", {c.lo, c.hi}},
                            {"p", c.p}});
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
                        {"within_run_spread", num(row.noise)},
                        {"evidence", row.evidence},
                        {"runs_base", row.runs_base},
                        {"runs_head", row.runs_head},
                        {"run_noise", num(row.run_noise)},
                        {"noise_source", row.noise_source},
                        {"min_detectable_change", num(row.mdc)},
                        {"rounds_needed", row.rounds_needed},
                        {"round_noise", num(row.round_noise)},
                        {"round_noise_source", row.round_noise_source},
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
