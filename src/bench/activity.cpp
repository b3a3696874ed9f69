// The device's activity records in the layer times (layer_times.hpp: summarize_activity): how long
// tower 0's device was busy and idle in each probed step, the largest idle gaps and what was on
// either side, and each piece's kernels.
#include <algorithm>
#include <map>
#include <tuple>

#include "bench/layer_times.hpp"
#include "bench/stats.hpp"

namespace stepbench {

namespace {

std::string piece_name(const KernelSpan& k, const std::vector<std::string>& labels) {
  if (k.layer == KernelSpan::kUntagged) return "(no piece: " + k.name.substr(0, 40) + ")";
  if (k.layer >= 0 && static_cast<std::size_t>(k.layer) < labels.size())
    return labels[static_cast<std::size_t>(k.layer)] + "/" + k.part;
  return k.part;  // the graph's own work, a phase's
}

}  // namespace

void summarize_activity(LayerTimes& lt, const std::vector<ProbedStep>& steps, const Towers& t) {
  std::vector<std::string> labels;
  for (const auto& l : t.graph(0).layers()) labels.push_back(l.label);
  std::vector<double> window, busy, gap, count, ngaps;
  std::vector<LayerTimes::Gap> gaps;
  // per row (layer, part, pass) and kernel name: its time in each step
  using Key = std::tuple<int, std::string, std::string>;
  std::map<Key, std::size_t> row_of;
  for (std::size_t i = 0; i < lt.rows.size(); ++i) row_of[{lt.rows[i].layer, lt.rows[i].part, lt.rows[i].pass}] = i;
  std::vector<std::map<std::string, std::vector<double>>> per_row(lt.rows.size());
  std::vector<std::map<std::string, int>> launches(lt.rows.size());
  int counted_steps = 0;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    if (steps[s].kernels.empty() || steps[s].kernels[0].empty()) continue;
    const auto& v = steps[s].kernels[0];  // by start
    ++counted_steps;
    double b = 0, g = 0, end = v.front().t1;
    int n = 0;
    const KernelSpan* last = &v.front();  // the record that ends last so far
    for (std::size_t i = 0; i < v.size(); ++i) {
      const KernelSpan& k = v[i];
      if (i > 0 && k.t0 > end) {  // the device ran nothing in between
        g += k.t0 - end;
        ++n;
        gaps.push_back({k.t0 - end, static_cast<int>(s), piece_name(*last, labels), piece_name(k, labels)});
      }
      if (i == 0 || k.t0 > end)
        b += k.t1 - k.t0;
      else if (k.t1 > end)
        b += k.t1 - end;
      if (i == 0 || k.t1 > end) end = k.t1, last = &k;
    }
    window.push_back(end - v.front().t0);
    busy.push_back(b);
    gap.push_back(g);
    ngaps.push_back(n);
    count.push_back(static_cast<double>(v.size()));
    std::vector<std::map<std::string, double>> this_step(lt.rows.size());
    for (const auto& k : v) {
      if (k.layer == KernelSpan::kUntagged) continue;
      const auto r = row_of.find({k.layer, k.part, k.phase});
      if (r == row_of.end()) continue;
      this_step[r->second][k.name] += k.t1 - k.t0;
      if (counted_steps == 1) ++launches[r->second][k.name];
    }
    for (std::size_t r = 0; r < this_step.size(); ++r)
      for (const auto& [name, ms] : this_step[r]) per_row[r][name].push_back(ms);
  }
  if (counted_steps == 0) return;
  lt.kernels = static_cast<int>(median(count));
  lt.window_ms = median(window);
  lt.busy_ms = median(busy);
  lt.gap_ms = median(gap);
  lt.gaps = static_cast<int>(median(ngaps));
  std::sort(gaps.begin(), gaps.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
  if (gaps.size() > 5) gaps.resize(5);
  lt.largest_gaps = std::move(gaps);
  lt.row_kernels.assign(lt.rows.size(), {});
  for (std::size_t r = 0; r < per_row.size(); ++r) {
    for (auto& [name, ms] : per_row[r]) {
      ms.resize(static_cast<std::size_t>(counted_steps), 0.0);  // a step that did not launch it: 0
      lt.row_kernels[r].push_back({name, median(ms), launches[r][name]});
    }
    std::sort(lt.row_kernels[r].begin(), lt.row_kernels[r].end(),
              [](const auto& a, const auto& b) { return a.ms > b.ms; });
  }
}

}  // namespace stepbench
