// compare_runs: the per-benchmark test, the status and the layers that moved.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "compare/compare.hpp"
#include "compare/stats.hpp"

namespace stepbench::compare {

const char* to_string(Status s) {
  switch (s) {
    case Status::regression: return "regression";
    case Status::suspicious: return "suspicious";
    case Status::no_change: return "no change";
    case Status::improvement: return "improvement";
    case Status::insufficient: return "insufficient data";
    case Status::unstable: return "unstable";
  }
  return "?";
}

int Report::exit_code() const {
  return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.status == Status::regression; }) ? 1 : 0;
}

std::string Report::rerun_hint() const {
  std::size_t n = 0;
  for (const auto& r : rows) n = std::max(n, r.status == Status::insufficient ? r.repetitions_needed : 0);
  return n == 0 ? "" : fmt::format("to decide, rerun both runs with --repetitions {} (or more)", n);
}

namespace {

bool is_per_layer(const std::string& key) { return key.find("/conv:") != std::string::npos; }

std::string prefix_of(const std::string& key) {
  const auto slash = key.rfind('/');
  return slash == std::string::npos ? "" : key.substr(0, slash);
}

std::string phase_of(const std::string& key) {
  const auto slash = key.rfind('/');
  return slash == std::string::npos ? key : key.substr(slash + 1);
}

std::vector<std::string> directions_of(const std::string& phase) {
  if (phase.rfind("forward_backward", 0) == 0 || phase.rfind("step", 0) == 0) return {"fwd", "bwd_data", "bwd_filter"};
  if (phase.rfind("forward", 0) == 0) return {"fwd"};
  return {};
}

const char* direction_name(const std::string& d) {
  return d == "fwd" ? "forward" : d == "bwd_data" ? "backward data" : "backward filter";
}

// Fills the row's statistics (not the adjusted p-values or the status).
void measure(Row& r, const Series& b, const Series& h, const Options& o) {
  r.n_base = b.ms.size();
  r.n_head = h.ms.size();
  r.base_ms = median(b.ms);
  r.head_ms = median(h.ms);
  r.change = r.head_ms / r.base_ms - 1;
  r.noise = std::max(relative_spread(b.ms), relative_spread(h.ms));
  r.throttled_base = b.throttled;
  r.throttled_head = h.throttled;
  const Interval iv = bootstrap_median_ratio(b.ms, h.ms, 1 - o.alpha);
  r.ci_lo = iv.lo;
  r.ci_hi = iv.hi;
}

void decide(Row& r, const Options& o) {
  const double floor = std::max(o.threshold, r.noise);
  const bool slower = r.p_slower < o.alpha && r.ci_lo > 1 && r.change > floor;
  const bool faster = r.p_faster < o.alpha && r.ci_hi < 1 && -r.change > floor;
  // a GPU throttled in some repetitions of one side and not as often in the other: the difference
  // may be the clocks, not the code (both sides held at the same power cap compare fairly)
  const bool throttled = r.n_base > 0 && r.n_head > 0 &&
                         static_cast<double>(r.throttled_base) / static_cast<double>(r.n_base) !=
                             static_cast<double>(r.throttled_head) / static_cast<double>(r.n_head);
  const std::string floor_text =
      fmt::format("{:.1f}% ({})", 100 * floor, floor > o.threshold ? "the runs' own spread" : "--threshold");
  if (slower) {
    r.status = throttled ? Status::unstable : Status::regression;
    r.reason = throttled ? fmt::format("slower, but the GPU was throttled in {} base and {} head repetitions",
                                       r.throttled_base, r.throttled_head)
                         : fmt::format("slower by more than {}, p {:.2g} after Holm", floor_text, r.p_slower);
  } else if (faster) {
    r.status = Status::improvement;
    r.reason = fmt::format("faster by more than {}, p {:.2g} after Holm", floor_text, r.p_faster);
  } else if (r.change > floor) {
    r.status = Status::suspicious;
    r.reason = fmt::format("slower by more than {} but not significant (p {:.2g} after Holm, interval from {:+.1f}%)",
                           floor_text, r.p_slower, 100 * (r.ci_lo - 1));
  } else {
    r.status = Status::no_change;
    r.reason = r.p_slower < o.alpha && r.ci_lo > 1   ? fmt::format("slower, significant, but within {}", floor_text)
               : r.p_faster < o.alpha && r.ci_hi < 1 ? fmt::format("faster, significant, but within {}", floor_text)
                                                     : "";
  }
}

// The per-layer benchmarks under the phase's prefix in its directions, ranked by their change
// times the layers of that shape; those that make up 80% of the slowdown, at most five, each with a
// significant change of its own (p < alpha before correction).
std::vector<LayerMove> layers_that_moved(const Row& phase, const std::vector<Row>& rows, const Run& base,
                                         const Run& head, const Options& o) {
  std::vector<LayerMove> v;
  const auto dirs = directions_of(phase_of(phase.key));
  const std::string prefix = prefix_of(phase.key);
  for (const auto& r : rows) {
    if (!r.per_layer || prefix_of(prefix_of(r.key)) != prefix) continue;
    const std::string dir = phase_of(r.key);
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) continue;
    const Series& h = head.benchmarks.at(r.key);
    const double layers = h.layers;
    const auto raw = mann_whitney_u(h.ms, base.benchmarks.at(r.key).ms, Alternative::greater);
    const double delta = (r.head_ms - r.base_ms) * layers;
    if (delta <= 0 || raw.p >= o.alpha) continue;
    LayerMove m;
    m.key = prefix_of(r.key).substr(prefix.size() + 1);
    m.label = h.label;
    m.direction = direction_name(dir);
    m.delta_ms = delta;
    m.change = r.change;
    const double phase_delta = phase.head_ms - phase.base_ms;
    m.share = phase_delta > 0 ? delta / phase_delta : 0;
    v.push_back(m);
  }
  std::sort(v.begin(), v.end(), [](const LayerMove& a, const LayerMove& b) { return a.delta_ms > b.delta_ms; });
  double total = 0, acc = 0;
  for (const auto& m : v) total += m.delta_ms;
  std::vector<LayerMove> top;
  for (const auto& m : v) {
    if (top.size() == 5 || (total > 0 && acc >= 0.8 * total)) break;
    top.push_back(m);
    acc += m.delta_ms;
  }
  return top;
}

}  // namespace

Report compare_runs(const Run& base, const Run& head, const Options& o) {
  Report rep;
  rep.base_source = base.source;
  rep.head_source = head.source;
  rep.options = o;
  const auto machine = context_differences(base.context, head.context, fingerprint_keys());
  const auto config = context_differences(base.context, head.context, configuration_keys());
  if (!machine.empty()) rep.notes.push_back(fmt::format("different machines: {}", fmt::join(machine, "; ")));
  if (!config.empty()) rep.notes.push_back(fmt::format("different configurations: {}", fmt::join(config, "; ")));
  const bool from_history = base.source.rfind("history ", 0) == 0;
  std::vector<std::string> keys;
  for (const auto& k : head.order)
    if (base.benchmarks.count(k) || (from_history && base.benchmarks.empty())) keys.push_back(k);
  if (keys.empty())
    throw CompareError(
        fmt::format("{} and {} have no benchmark in common (different model, precision, layout, GPU "
                    "count or batch size in the names?)",
                    base.source, head.source));
  // phases first, then the per-layer benchmarks; each family corrected on its own
  std::stable_partition(keys.begin(), keys.end(), [](const std::string& k) { return !is_per_layer(k); });
  for (const auto& k : keys) {
    Row r;
    r.key = k;
    r.per_layer = is_per_layer(k);
    auto bi = base.benchmarks.find(k);
    if (bi == base.benchmarks.end()) {
      r.n_head = head.benchmarks.at(k).ms.size();
      r.reason = "no earlier run on this machine and configuration in the history";
    } else {
      measure(r, bi->second, head.benchmarks.at(k), o);
      if (!machine.empty())
        r.reason = "different machines";
      else if (!config.empty())
        r.reason = "different configurations";
      else if (std::min(r.n_base, r.n_head) < static_cast<std::size_t>(o.min_repetitions)) {
        r.reason = fmt::format("{} and {} repetitions; at least {} per side (--repetitions)", r.n_base, r.n_head,
                               o.min_repetitions);
        r.repetitions_needed = static_cast<std::size_t>(o.min_repetitions);
      } else
        r.status = Status::no_change;  // eligible so far: the family's size decides below
    }
    rep.rows.push_back(r);
  }
  for (bool layer_family : {false, true}) {
    // Holm multiplies the smallest p-value by the family's size m: sizes whose smallest reachable
    // p-value (1 / C(n1 + n2, n1)) times m is not below alpha can never be significant
    std::size_t m = 0;
    for (const auto& r : rep.rows) m += r.per_layer == layer_family && r.status != Status::insufficient;
    for (auto& r : rep.rows) {
      if (r.per_layer != layer_family || r.status == Status::insufficient) continue;
      if (static_cast<double>(m) * smallest_p(r.n_base, r.n_head) >= o.alpha) {
        std::size_t n = 2;
        while (static_cast<double>(m) * smallest_p(n, n) >= o.alpha) ++n;
        r.status = Status::insufficient;
        r.repetitions_needed = n;
        r.reason =
            fmt::format("{} and {} repetitions cannot reach p < {:g} after Holm over {} {}; at least {} per side",
                        r.n_base, r.n_head, o.alpha, m, layer_family ? "per-layer benchmarks" : "phases", n);
      }
    }
    // what a rerun needs, for every row short of repetitions: Holm over the rows that would then count
    std::size_t family = 0;
    for (const auto& r : rep.rows)
      family += r.per_layer == layer_family && (r.status != Status::insufficient || r.repetitions_needed > 0);
    std::size_t need = 2;
    while (static_cast<double>(family) * smallest_p(need, need) >= o.alpha) ++need;
    for (auto& r : rep.rows)
      if (r.per_layer == layer_family && r.repetitions_needed > 0)
        r.repetitions_needed = std::max(r.repetitions_needed, need);
    std::vector<std::size_t> idx;
    std::vector<double> ps, pf;
    for (std::size_t i = 0; i < rep.rows.size(); ++i) {
      Row& r = rep.rows[i];
      if (r.per_layer != layer_family || r.status == Status::insufficient) continue;
      const auto& b = base.benchmarks.at(r.key).ms;
      const auto& h = head.benchmarks.at(r.key).ms;
      idx.push_back(i);
      ps.push_back(mann_whitney_u(h, b, Alternative::greater).p);
      pf.push_back(mann_whitney_u(h, b, Alternative::less).p);
    }
    const auto as = holm(ps), af = holm(pf);
    for (std::size_t j = 0; j < idx.size(); ++j) {
      Row& r = rep.rows[idx[j]];
      r.p_slower = as[j];
      r.p_faster = af[j];
      decide(r, o);
    }
  }
  for (auto& r : rep.rows)
    if (!r.per_layer &&
        (r.status == Status::regression || r.status == Status::unstable || r.status == Status::suspicious))
      r.layers = layers_that_moved(r, rep.rows, base, head, o);
  return rep;
}

}  // namespace stepbench::compare
