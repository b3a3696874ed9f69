// compare_runs: the per-benchmark test, the status and the layers that moved.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "compare/compare.hpp"
#include "compare/evidence.hpp"
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
    case Status::unknown: return "unknown";
  }
  return "?";
}

int Report::exit_code() const {
  return std::any_of(rows.begin(), rows.end(),
                     [&](const Row& r) {
                       return r.status == Status::regression ||
                              (options.fail_on_unknown && !r.per_layer &&
                               (r.status == Status::unknown || r.status == Status::insufficient));
                     })
             ? 1
             : 0;
}

std::string Report::rerun_hint() const {
  std::size_t reps = 0, rounds = 0;
  for (const auto& r : rows) {
    if (r.status == Status::insufficient) reps = std::max(reps, r.repetitions_needed);
    // rounds for the phases (per-layer rows need many more to survive Holm over dozens of shapes)
    if (!r.per_layer && (r.status == Status::insufficient || r.status == Status::unknown))
      rounds = std::max(rounds, r.rounds_needed);
  }
  if (reps > 0) return fmt::format("to decide, rerun both runs with --repetitions {} (or more)", reps);
  // the noise the most rounds were sized with
  const Row* by = nullptr;
  for (const auto& r : rows)
    if (!r.per_layer && r.rounds_needed == rounds && rounds > 0 && !by) by = &r;
  const std::string at =
      by ? fmt::format("at a paired noise of {:.1f}% ({})", 100 * by->round_noise, by->round_noise_source) : "";
  if (rounds >= 1000)
    return fmt::format(
        "to find {:.1f}% {:.0f}% of the time {} would take more than 1000 interleaved rounds: quiet the "
        "machine, raise --threshold, or keep a --history",
        100 * options.threshold, 100 * kAdvicePower, at);
  if (rounds > 0)
    return fmt::format(
        "to find {:.1f}% {:.0f}% of the time {}, run both revisions interleaved: scripts/ab.sh BASE HEAD "
        "--rounds {} -- <the same flags>",
        100 * options.threshold, 100 * kAdvicePower, at, rounds);
  return "";
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

// Fills the row's medians and spreads; the run-level evidence fills the change's interval.
void measure(Row& r, const Series& b, const Series& h) {
  r.n_base = b.ms.size();
  r.n_head = h.ms.size();
  r.base_ms = median(b.ms);
  r.head_ms = median(h.ms);
  r.change = r.head_ms / r.base_ms - 1;
  r.noise = std::max(relative_spread(b.ms), relative_spread(h.ms));
  r.throttled_base = b.throttled;
  r.throttled_head = h.throttled;
  r.ci_lo = r.ci_hi = NAN;
}

const char* evidence_can_show(const std::string& evidence) {
  return evidence == "rounds"    ? "these rounds show"
         : evidence == "history" ? "a run against this history shows"
                                 : "two lone runs show";
}

void decide(Row& r, const Options& o, bool u_slower, bool u_faster) {
  const double floor = o.threshold;
  const bool slower = r.p_slower < o.alpha && u_slower && r.change > floor;
  const bool faster = r.p_faster < o.alpha && u_faster && -r.change > floor;
  // a GPU throttled in some repetitions of one side and not as often in the other: the difference
  // may be the clocks, not the code (both sides held at the same power cap compare fairly)
  const bool throttled = r.n_base > 0 && r.n_head > 0 &&
                         static_cast<double>(r.throttled_base) / static_cast<double>(r.n_base) !=
                             static_cast<double>(r.throttled_head) / static_cast<double>(r.n_head);
  const std::string can_show = fmt::format("{} changes beyond {:.1f}%", evidence_can_show(r.evidence), 100 * r.mdc);
  if (slower) {
    r.status = throttled ? Status::unstable : Status::regression;
    r.reason = throttled
                   ? fmt::format("slower, but the GPU was throttled in {} base and {} head repetitions",
                                 r.throttled_base, r.throttled_head)
                   : fmt::format("slower beyond the run-to-run noise ({}; p {:.2g} after Holm)", can_show, r.p_slower);
  } else if (faster) {
    r.status = Status::improvement;
    r.reason = fmt::format("faster beyond the run-to-run noise ({}; p {:.2g} after Holm)", can_show, r.p_faster);
  } else if ((r.p_slower < o.alpha && r.change > floor) || (r.p_faster < o.alpha && -r.change > floor)) {
    // beyond the run-to-run noise, but the repetitions of the two runs do not tell them apart
    r.status = Status::unknown;
    r.reason = fmt::format(
        "{} beyond the run-to-run noise, but the two runs' repetitions overlap (the within-run "
        "test, after Holm); {}",
        r.change > 0 ? "slower" : "faster", can_show);
  } else if (r.mdc <= floor) {
    r.status = Status::no_change;
    r.reason = fmt::format("within the noise; {}", can_show);
  } else {
    r.status = Status::unknown;
    r.reason = fmt::format("within the run-to-run noise ({}; the noise from {})", can_show, r.noise_source);
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

// The base windows of a history's phases in words: "runs 8-12 of 12, the last 5 for forward, ...;
// runs 9-12 of 12, since the change point at run 9 (rev8) for step".
std::string windows_text(const std::map<std::string, std::string>& windows) {
  std::vector<std::pair<std::string, std::vector<std::string>>> by;  // window, its phases in key order
  for (const auto& kv : windows) {
    const std::string& key = kv.first;
    const std::string& w = kv.second;
    if (is_per_layer(key)) continue;
    auto it = std::find_if(by.begin(), by.end(), [&w](const auto& p) { return p.first == w; });
    if (it == by.end()) it = by.insert(by.end(), {w, {}});
    it->second.push_back(phase_of(key));
  }
  std::vector<std::string> parts;
  parts.reserve(by.size());
  for (const auto& [w, phases] : by) parts.push_back(fmt::format("{} for {}", w, fmt::join(phases, ", ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace

Report compare_runs(const Run& base_in, const Run& head, const Options& o) {
  // a history's base: each phase's runs since its last change point (evidence.cpp), said as such
  const bool from_history = base_in.source.rfind("history ", 0) == 0;
  Run pooled;
  if (from_history) pooled = base_in;
  const auto windows = from_history ? pool_since_change(pooled) : std::map<std::string, std::string>{};
  const Run& base = from_history ? pooled : base_in;
  Report rep;
  rep.base_source = base.source;
  if (!windows.empty())
    rep.base_source +=
        "; the base of each phase its runs since the series' last change point: " + windows_text(windows);
  rep.head_source = head.source;
  rep.options = o;
  const auto machine = context_differences(base.context, head.context, fingerprint_keys());
  const auto config = context_differences(base.context, head.context, configuration_keys());
  if (!machine.empty()) rep.notes.push_back(fmt::format("different machines: {}", fmt::join(machine, "; ")));
  if (!config.empty()) rep.notes.push_back(fmt::format("different configurations: {}", fmt::join(config, "; ")));
  const bool paired = !from_history && base.rounds > 0 && head.rounds > 0;
  const int rounds = std::min(base.rounds, head.rounds);
  const std::string evidence = paired ? "rounds" : from_history ? "history" : "runs";
  if (paired && base.rounds != head.rounds)
    rep.notes.push_back(
        fmt::format("the sides ran {} and {} rounds: the first {} are paired", base.rounds, head.rounds, rounds));
  // the stated run-to-run noise where the evidence does not measure it
  const std::string backend = head.context.count("backend") ? head.context.at("backend") : "cpu";
  const double sigma = o.run_noise >= 0 ? o.run_noise : default_run_noise(backend);
  const std::string sigma_source =
      o.run_noise >= 0 ? fmt::format("--run-noise {:.1f}%", 100 * sigma)
                       : fmt::format("the stated default for {}, {:.1f}% (--run-noise)", backend, 100 * sigma);
  const double round_sigma = o.round_noise >= 0 ? o.round_noise : default_round_noise(backend);
  const std::string round_source =
      o.round_noise >= 0 ? std::string("--round-noise")
                         : fmt::format("the stated default of ab.sh's rounds for {}, --round-noise", backend);
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
    r.evidence = evidence;
    auto bi = base.benchmarks.find(k);
    if (bi == base.benchmarks.end()) {
      r.n_head = head.benchmarks.at(k).ms.size();
      r.reason = "no earlier run on this machine and configuration in the history";
    } else {
      measure(r, bi->second, head.benchmarks.at(k));
      if (!machine.empty())
        r.reason = "different machines";
      else if (!config.empty())
        r.reason = "different configurations";
      else if (!paired && std::min(r.n_base, r.n_head) < static_cast<std::size_t>(o.min_repetitions)) {
        r.reason = fmt::format("{} and {} repetitions; at least {} per side (--repetitions)", r.n_base, r.n_head,
                               o.min_repetitions);
        r.repetitions_needed = static_cast<std::size_t>(o.min_repetitions);
      } else
        r.status = Status::no_change;  // eligible so far: the family's size decides below
    }
    rep.rows.push_back(r);
  }
  for (bool layer_family : {false, true}) {
    std::size_t m = 0;
    for (const auto& r : rep.rows) m += r.per_layer == layer_family && r.status != Status::insufficient;
    if (!paired) {
      // the within-run U test is a necessary condition: Holm multiplies the smallest p-value by the
      // family's size m, so sizes whose smallest reachable p-value (1 / C(n1 + n2, n1)) times m is
      // not below alpha can never decide
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
      m = 0;
      for (const auto& r : rep.rows) m += r.per_layer == layer_family && r.status != Status::insufficient;
    }
    if (m == 0) continue;
    // the run-level evidence of each eligible row
    std::vector<std::size_t> idx;
    std::vector<RunEvidence> ev;
    for (std::size_t i = 0; i < rep.rows.size(); ++i) {
      Row& r = rep.rows[i];
      if (r.per_layer != layer_family || r.status == Status::insufficient) continue;
      const Series& b = base.benchmarks.at(r.key);
      const Series& h = head.benchmarks.at(r.key);
      RunEvidence e = paired         ? rounds_evidence(b, h, rounds, o.alpha, m)
                      : from_history ? history_evidence(b, r.head_ms, o.alpha, m, sigma, sigma_source)
                                     : runs_evidence(r.base_ms, r.head_ms, o.alpha, m, sigma, sigma_source);
      r.runs_base = e.n_base;
      r.runs_head = e.n_head;
      if (!e.usable) {
        r.status = Status::insufficient;
        r.reason = paired ? fmt::format("{} rounds paired; at least 3 (ab.sh --rounds)", e.n_base)
                          : "no earlier run's median in the history";
        continue;
      }
      if (paired && static_cast<double>(m) * smallest_signed_rank_p(e.n_base) >= o.alpha) {
        r.status = Status::insufficient;
        r.rounds_needed = rounds_for(o.threshold, std::max(e.rounds_sd, 1e-9), o.alpha, m);
        r.round_noise = e.rounds_sd;
        r.round_noise_source = e.source;
        std::size_t n = 3;
        while (static_cast<double>(m) * smallest_signed_rank_p(n) >= o.alpha) ++n;
        r.rounds_needed = std::max(r.rounds_needed, n);
        r.reason = fmt::format("{} rounds cannot reach p < {:g} after Holm over {} {}; at least {} (ab.sh --rounds)",
                               e.n_base, o.alpha, m, layer_family ? "per-layer benchmarks" : "phases", n);
        continue;
      }
      r.change = std::exp(e.d) - 1;
      if (from_history) r.base_ms = r.head_ms / std::exp(e.d);  // the history's level since its last change
      r.ci_lo = e.ratio.lo;
      r.ci_hi = e.ratio.hi;
      r.run_noise = e.noise;
      r.noise_source = e.source;
      r.mdc = std::expm1(e.crit);
      idx.push_back(i);
      ev.push_back(e);
    }
    // Holm over the family: the run-level tests, and (runs, history) the within-run U test, which is
    // a necessary condition
    std::vector<double> ps, pf, us, uf;
    for (std::size_t j = 0; j < idx.size(); ++j) {
      ps.push_back(ev[j].p_slower);
      pf.push_back(ev[j].p_faster);
      const auto& b = base.benchmarks.at(rep.rows[idx[j]].key).ms;
      const auto& h = head.benchmarks.at(rep.rows[idx[j]].key).ms;
      us.push_back(paired ? 0.0 : mann_whitney_u(h, b, Alternative::greater).p);
      uf.push_back(paired ? 0.0 : mann_whitney_u(h, b, Alternative::less).p);
    }
    const auto as = holm(ps), af = holm(pf), aus = holm(us), auf = holm(uf);
    for (std::size_t j = 0; j < idx.size(); ++j) {
      Row& r = rep.rows[idx[j]];
      r.p_slower = as[j];
      r.p_faster = af[j];
      // the rounds' own spread, or (two lone runs, a history: the pairing's noise is not measured) the
      // stated paired noise of ab.sh's rounds, not the runs' noise: pairing cancels what a slot shares
      r.round_noise = paired ? ev[j].rounds_sd : round_sigma;
      r.round_noise_source = paired ? ev[j].source : round_source;
      r.rounds_needed = rounds_for(o.threshold, std::max(r.round_noise, 1e-9), o.alpha, idx.size());
      if (paired && r.rounds_needed <= ev[j].n_base) r.rounds_needed = ev[j].n_base + 1;
      decide(r, o, aus[j] < o.alpha, auf[j] < o.alpha);
    }
  }
  for (auto& r : rep.rows)
    if (!r.per_layer && (r.status == Status::regression || r.status == Status::unstable ||
                         (r.status == Status::unknown && r.change > o.threshold)))
      r.layers = layers_that_moved(r, rep.rows, base, head, o);
  if (from_history) {
    rep.changes = history_changes(base, head, rep.rows, o);
    rep.history = base.history;
  }
  return rep;
}

}  // namespace stepbench::compare
