// analyze_stragglers and its report (straggler.hpp).
#include "bench/straggler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "bench/stats.hpp"

namespace stepbench {
namespace {

double relative_spread(std::vector<double> v) {  // 1.4826 MAD / median: a robust coefficient of variation
  if (v.size() < 2) return 0;
  const double m = median(v);
  for (auto& x : v) x = std::abs(x - m);
  return m > 0 ? 1.4826 * median(v) / m : 0;
}

// When the last bucket's sync ends: each sync starts once every tower has the bucket ready and the
// previous sync is done, and takes as long as it took. ready[t][k].
double sync_end(const std::vector<std::vector<double>>& ready, const std::vector<double>& sync_ms) {
  const std::size_t buckets = ready.empty() ? 0 : ready[0].size();
  double end = 0;
  for (std::size_t k = 0; k < buckets; ++k) {
    double start = 0;
    for (const auto& r : ready) start = std::max(start, r[k]);
    end = std::max(end, start) + (k < sync_ms.size() ? sync_ms[k] : 0.0);
  }
  return end;
}

// Every tower's bucket-ready times in one step (the compute's end when there are no buckets).
std::vector<std::vector<double>> ready_times(const std::vector<TowerStep>& step) {
  std::vector<std::vector<double>> r;
  r.reserve(step.size());
  for (const auto& t : step)
    r.push_back(t.ready_ms.empty() ? std::vector<double>{t.begin_ms + t.compute()} : t.ready_ms);
  return r;
}

// The step's sync end with tower s at reference tower ref's compute, minus as measured.
double cost_of(const std::vector<TowerStep>& step, const StragglerInput& in, int s, int ref) {
  auto ready = ready_times(step);
  const auto at = [](int t) { return static_cast<std::size_t>(t); };
  const double measured = sync_end(ready, in.sync_ms);
  const TowerStep &slow = step[at(s)], &r = step[at(ref)];
  if (in.sequential) {  // the slow tower's extra compute delayed every tower after it in its process
    const double extra = std::max(0.0, slow.compute() - r.compute());
    const int first = s / in.towers_per_process * in.towers_per_process;
    for (int t = s; t < first + in.towers_per_process && at(t) < ready.size(); ++t)
      for (auto& x : ready[at(t)]) x -= extra;
  } else {  // its buckets ready when the reference's were, relative to each one's start
    auto& rs = ready[at(s)];
    const auto rr = ready_times({r})[0];
    for (std::size_t k = 0; k < rs.size() && k < rr.size(); ++k)
      rs[k] -= std::max(0.0, (rs[k] - slow.begin_ms) - (rr[k] - r.begin_ms));
  }
  return std::max(0.0, measured - sync_end(ready, in.sync_ms));
}

}  // namespace

std::vector<double> bucket_sync_ms(const StragglerInput& in) {
  std::vector<std::vector<double>> per;  // [bucket][step]
  for (const auto& r : in.steps)
    for (const auto& step : r) {
      for (std::size_t k = 0; !step.empty() && k < step[0].synced_ms.size(); ++k) {
        double least = -1;
        for (const auto& t : step) {
          if (k >= t.synced_ms.size() || k >= t.ready_ms.size()) continue;
          const double start = std::max(t.ready_ms[k], k > 0 ? t.synced_ms[k - 1] : 0.0);
          const double d = std::max(0.0, t.synced_ms[k] - start);
          least = least < 0 ? d : std::min(least, d);
        }
        if (per.size() <= k) per.resize(k + 1);
        if (least >= 0) per[k].push_back(least);
      }
    }
  std::vector<double> out;
  out.reserve(per.size());
  for (const auto& v : per) out.push_back(v.empty() ? 0 : median(v));
  return out;
}

StragglerReport analyze_stragglers(const StragglerInput& in_) {
  StragglerInput with;
  const bool derive = in_.sync_ms.empty();
  if (derive) {
    with = in_;
    with.sync_ms = bucket_sync_ms(in_);
  }
  const StragglerInput& in = derive ? with : in_;
  StragglerReport rep;
  const std::size_t n = in.towers.size();
  std::vector<std::vector<double>> compute(n), wait(n);
  for (const auto& r : in.steps)
    for (const auto& step : r)
      for (std::size_t t = 0; t < n && t < step.size(); ++t) {
        compute[t].push_back(step[t].compute());
        wait[t].push_back(std::max(0.0, step[t].released_ms - step[t].begin_ms - step[t].compute()));
      }
  if (n < 2 || compute[0].empty()) return rep;
  rep.valid = true;
  rep.repetitions = static_cast<int>(in.steps.size());
  std::vector<double> medians, spreads;
  for (std::size_t t = 0; t < n; ++t) {
    TowerScore s;
    s.tower = in.towers[t].tower;
    s.median_ms = median(compute[t]);
    s.best_ms = *std::min_element(compute[t].begin(), compute[t].end());
    s.wait_ms = median(wait[t]);
    s.individual = s.median_ms > 0 ? s.best_ms / s.median_ms : 1;
    medians.push_back(s.median_ms);
    spreads.push_back(relative_spread(compute[t]));
    rep.towers.push_back(s);
  }
  rep.slowest = static_cast<int>(std::max_element(medians.begin(), medians.end()) - medians.begin());
  rep.fastest = static_cast<int>(std::min_element(medians.begin(), medians.end()) - medians.begin());
  for (auto& s : rep.towers)
    s.relative = s.median_ms > 0 ? medians[static_cast<std::size_t>(rep.fastest)] / s.median_ms : 1;
  rep.min_ms = medians[static_cast<std::size_t>(rep.fastest)];
  rep.max_ms = medians[static_cast<std::size_t>(rep.slowest)];
  rep.median_ms = median(medians);
  rep.noise = median(spreads);
  rep.threshold = std::max(0.05, 3 * rep.noise);

  // per repetition: the slowest tower by its median there, a straggler when beyond the threshold
  for (const auto& r : in.steps) {
    std::vector<double> m;
    for (std::size_t t = 0; t < n; ++t) {
      std::vector<double> v;
      for (const auto& step : r)
        if (t < step.size()) v.push_back(step[t].compute());
      m.push_back(v.empty() ? 0 : median(v));
    }
    const auto s = static_cast<std::size_t>(std::max_element(m.begin(), m.end()) - m.begin());
    const double fastest = *std::min_element(m.begin(), m.end());
    if (m[s] > fastest * (1 + rep.threshold)) {
      ++rep.towers[s].slowest_in;
      ++rep.flagged;
    }
  }
  const bool chronic = rep.towers[static_cast<std::size_t>(rep.slowest)].slowest_in == rep.repetitions;
  rep.verdict = chronic ? "chronic" : rep.flagged > 0 ? "occasional" : "none";

  // the reference: the other towers' median by compute (the lower middle one)
  std::vector<std::pair<double, int>> others;
  for (std::size_t t = 0; t < n; ++t)
    if (static_cast<int>(t) != rep.slowest) others.emplace_back(medians[t], static_cast<int>(t));
  std::sort(others.begin(), others.end());
  const int ref = others[(others.size() - 1) / 2].second;
  std::vector<double> costs, steps;
  for (const auto& r : in.steps)
    for (const auto& step : r)
      if (step.size() == n) costs.push_back(cost_of(step, in, rep.slowest, ref));
  for (const auto& r : in.step_ms) steps.insert(steps.end(), r.begin(), r.end());
  rep.cost_ms = costs.empty() ? 0 : median(costs);
  rep.step_ms = steps.empty() ? 0 : median(steps);
  return rep;
}

namespace {

std::string where(const TowerId& t) {
  std::string s = fmt::format("rank {}, {}{}", t.rank, t.node >= 0 ? fmt::format("node {}, ", t.node) : "",
                              t.host.empty() ? "this host" : t.host);
  if (t.device >= 0) s += fmt::format(", GPU {}", t.device);
  if (!t.bus_id.empty()) s += " " + t.bus_id;
  if (!t.uuid.empty()) s += " " + t.uuid;
  return s;
}

}  // namespace

std::vector<std::string> straggler_lines(const StragglerInput& in, const StragglerReport& r, int top) {
  std::vector<std::string> out;
  if (!r.valid) return out;
  const auto at = [](int t) { return static_cast<std::size_t>(t); };
  const TowerId &slow = in.towers[at(r.slowest)], &fast = in.towers[at(r.fastest)];
  const TowerScore& s = r.towers[at(r.slowest)];
  out.push_back(fmt::format(
      "stragglers: compute before the sync (forward + backward) per tower: min {:.3f}, median {:.3f}, max {:.3f} ms; "
      "noise {:.1f}%, a straggler is {:.1f}% over the fastest",
      r.min_ms, r.median_ms, r.max_ms, 100 * r.noise, 100 * r.threshold));
  std::string verdict = r.verdict == "chronic" ? fmt::format("chronic (the straggler in {} of {} repetitions)",
                                                             s.slowest_in, r.repetitions)
                        : r.verdict == "occasional"
                            ? fmt::format("occasional (a straggler in {} of {} repetitions)", r.flagged, r.repetitions)
                            : "within the noise: no straggler";
  out.push_back(fmt::format("  slowest: tower {} ({}) {:.3f} ms, relative {:.2f}, individual {:.2f}; {}{}", slow.tower,
                            where(slow), s.median_ms, s.relative, s.individual, verdict,
                            slow.state.empty() ? "" : "; " + slow.state));
  out.push_back(fmt::format("  fastest: tower {} ({}) {:.3f} ms", fast.tower, where(fast), r.min_ms));
  if (r.step_ms > 0)
    out.push_back(fmt::format(
        "  cost: {:.3f} ms of the {:.3f} ms step ({:.1f}%): with tower {} at the others' median compute the step "
        "would take {:.3f} ms",
        r.cost_ms, r.step_ms, 100 * r.cost_share(), slow.tower, r.step_ms - r.cost_ms));
  std::vector<int> order;
  for (std::size_t t = 0; t < r.towers.size(); ++t) order.push_back(static_cast<int>(t));
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return r.towers[at(a)].median_ms > r.towers[at(b)].median_ms; });
  out.push_back(fmt::format("  {:>5} {:>5} {:>16} {:>4} {:>11} {:>8} {:>9} {:>11} {:>13}", "tower", "rank", "host",
                            "gpu", "compute ms", "wait ms", "relative", "individual", "straggler in"));
  for (std::size_t i = 0; i < order.size() && static_cast<int>(i) < top; ++i) {
    const TowerScore& t = r.towers[at(order[i])];
    const TowerId& id = in.towers[at(order[i])];
    out.push_back(fmt::format("  {:>5} {:>5} {:>16} {:>4} {:>11.3f} {:>8.3f} {:>9.2f} {:>11.2f} {:>13}", id.tower,
                              id.rank, id.host.substr(0, 16), id.device >= 0 ? std::to_string(id.device) : "cpu",
                              t.median_ms, t.wait_ms, t.relative, t.individual,
                              fmt::format("{} of {}", t.slowest_in, r.repetitions)));
  }
  return out;
}

nlohmann::json straggler_json(const StragglerInput& in, const StragglerReport& r) {
  nlohmann::json towers = nlohmann::json::array();
  for (std::size_t t = 0; t < r.towers.size(); ++t) {
    const auto& s = r.towers[t];
    const auto& id = in.towers[t];
    towers.push_back({{"tower", id.tower},
                      {"rank", id.rank},
                      {"node", id.node},
                      {"host", id.host},
                      {"device", id.device},
                      {"pci_bus_id", id.bus_id},
                      {"uuid", id.uuid},
                      {"device_state", id.state},
                      {"compute_ms", s.median_ms},
                      {"best_ms", s.best_ms},
                      {"wait_ms", s.wait_ms},
                      {"relative", s.relative},
                      {"individual", s.individual},
                      {"straggler_in_repetitions", s.slowest_in}});
  }
  return {{"towers", towers},
          {"slowest", in.towers[static_cast<std::size_t>(r.slowest)].tower},
          {"fastest", in.towers[static_cast<std::size_t>(r.fastest)].tower},
          {"compute_ms", {{"min", r.min_ms}, {"median", r.median_ms}, {"max", r.max_ms}}},
          {"noise", r.noise},
          {"threshold", r.threshold},
          {"verdict", r.verdict},
          {"repetitions", r.repetitions},
          {"repetitions_with_a_straggler", r.flagged},
          {"step_ms", r.step_ms},
          {"cost_ms", r.cost_ms},
          {"cost_share", r.cost_share()},
          {"sequential_towers", in.sequential}};
}

}  // namespace stepbench
