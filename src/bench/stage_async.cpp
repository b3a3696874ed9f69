// --cross-replica-sync off: the asynchronous parameter server's report. Every worker (process) times
// its own steps; their medians and pushes are gathered on the root process beside what the server
// (process 0) applied, so that the summary gives each worker's pace, the total, the staleness, and
// whether the server applied every push exactly once.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "bench/stages.hpp"
#include "bench/stats.hpp"
#include "bench/text.hpp"

namespace stepbench {

std::optional<AsyncReport> gather_async(Run& run) {
  if (!run.towers->asynchronous()) return std::nullopt;
  // this process's timed steps: the last --repetitions calls of the step fixture
  std::vector<double> mine;
  const auto& calls = run.step_samples;
  const std::size_t reps = static_cast<std::size_t>(std::max(run.c.repetitions, 1));
  for (std::size_t c = calls.size() > reps ? calls.size() - reps : 0; c < calls.size(); ++c)
    mine.insert(mine.end(), calls[c].begin(), calls[c].end());
  const AsyncStats s = run.towers->async_stats();
  const std::vector<double> all = run.group.allgather(
      std::vector<double>{mine.empty() ? NAN : median(mine), static_cast<double>(s.pushes), s.pushed_sum});
  if (!run.root) return std::nullopt;
  AsyncReport a;
  a.server = run.towers->async_stats();  // after the gather: every worker's pushes answered, so applied
  for (std::size_t r = 0; r + 2 < all.size(); r += 3) {
    a.step_ms.push_back(all[r]);
    a.pushes.push_back(all[r + 1]);
    a.pushed_sum.push_back(all[r + 2]);
  }
  return a;
}

namespace {

double images_per_s(const Run& run, double step_ms) {
  return 1000.0 * static_cast<double>(run.c.run.batch_per_tower) * run.towers->size() / step_ms;
}

double total_images_per_s(const Run& run, const AsyncReport& a) {
  double total = 0;
  for (double ms : a.step_ms)
    if (std::isfinite(ms) && ms > 0) total += images_per_s(run, ms);
  return total;
}

}  // namespace

void print_async(std::ostream& out, const Run& run, const AsyncReport& a) {
  std::vector<std::string> per;
  for (std::size_t w = 0; w < a.step_ms.size(); ++w)
    per.push_back(fmt::format("{} {:.1f}", w, images_per_s(run, a.step_ms[w])));
  out << wrap(fmt::format("asynchronous: images/s per worker (process): {}; {:.1f} in total (each worker's median "
                          "step, {} images, on its own clock)",
                          fmt::join(per, ", "), total_images_per_s(run, a),
                          static_cast<long>(run.c.run.batch_per_tower) * run.towers->size()),
              2);
  const double pushed = std::accumulate(a.pushes.begin(), a.pushes.end(), 0.0);
  const double sum = std::accumulate(a.pushed_sum.begin(), a.pushed_sum.end(), 0.0);
  const auto& st = a.server.staleness;
  out << wrap(fmt::format("  staleness: the pushing worker's variables were {} updates behind the server (median), "
                          "at most {}, over {} pushes; the server applied {} of the {} pushes{}",
                          st.empty() ? 0.0 : median(st), st.empty() ? 0.0 : *std::max_element(st.begin(), st.end()),
                          st.size(), a.server.applied, static_cast<long>(pushed),
                          static_cast<double>(a.server.applied) == pushed &&
                                  std::abs(a.server.applied_sum - sum) <= 1e-6 * (1 + std::abs(sum))
                              ? ", each once (their sums agree)"
                              : " (NOT each once: the sums or counts differ)"),
              4);
}

nlohmann::json async_json(const Run& run, const AsyncReport& a) {
  nlohmann::json workers = nlohmann::json::array();
  for (std::size_t w = 0; w < a.step_ms.size(); ++w)
    workers.push_back({{"rank", w},
                       {"step_ms", a.step_ms[w]},
                       {"images_per_s", images_per_s(run, a.step_ms[w])},
                       {"pushes", a.pushes[w]},
                       {"pushed_sum", a.pushed_sum[w]},
                       {"applied", w < a.server.applied_per_worker.size() ? a.server.applied_per_worker[w] : 0}});
  const auto& st = a.server.staleness;
  return {{"workers", workers},
          {"images_per_s", total_images_per_s(run, a)},
          {"applied", a.server.applied},
          {"applied_sum", a.server.applied_sum},
          {"staleness_median", st.empty() ? 0.0 : median(st)},
          {"staleness_max", st.empty() ? 0.0 : *std::max_element(st.begin(), st.end())}};
}

}  // namespace stepbench
