// --cross-replica-sync off: the asynchronous parameter servers' report. Every process times its own
// steps; the workers' medians and pushes and what each server applied are gathered on the root
// process, so that the summary gives each worker's pace, the total, the staleness, and whether the
// servers applied every push exactly once.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "bench/stages.hpp"
#include "bench/stats.hpp"
#include "bench/text.hpp"

namespace stepbench {

namespace {
constexpr std::size_t kFields = 9;  // per process in the first gather, then its applied_per_worker
}

std::optional<AsyncReport> gather_async(Run& run) {
  if (!run.towers->asynchronous()) return std::nullopt;
  // this process's timed steps: the last --repetitions calls of the step fixture
  std::vector<double> mine;
  const auto& calls = run.step_samples;
  const std::size_t reps = static_cast<std::size_t>(std::max(run.c.repetitions, 1));
  for (std::size_t c = calls.size() > reps ? calls.size() - reps : 0; c < calls.size(); ++c)
    mine.insert(mine.end(), calls[c].begin(), calls[c].end());
  const AsyncStats s = run.towers->async_stats();
  const auto size = static_cast<std::size_t>(run.group.size());
  std::vector<double> v{mine.empty() ? NAN : median(mine),      static_cast<double>(s.worker),
                        static_cast<double>(s.pushes),          s.pushed_sum,
                        static_cast<double>(s.serves),          static_cast<double>(s.shard_floats),
                        static_cast<double>(s.applied),         s.applied_sum,
                        static_cast<double>(s.staleness.size())};
  for (std::size_t r = 0; r < size; ++r)
    v.push_back(r < s.applied_per_worker.size() ? static_cast<double>(s.applied_per_worker[r]) : 0.0);
  const std::vector<double> all = run.group.allgather(v);
  const std::size_t stride = kFields + size;
  // every server's staleness, padded to the longest
  std::size_t longest = 0;
  for (std::size_t r = 0; r < size; ++r) longest = std::max(longest, static_cast<std::size_t>(all[r * stride + 8]));
  std::vector<double> st(s.staleness);
  st.resize(std::max<std::size_t>(longest, 1), NAN);
  const std::vector<double> stale = run.group.allgather(st);
  if (!run.root) return std::nullopt;

  AsyncReport a;
  a.node_workers = s.node_workers;
  const double images = static_cast<double>(run.c.run.batch_per_tower * run.towers->size()) *
                        (s.node_workers ? run.group.within_node().size() : 1);
  const std::size_t width = std::max<std::size_t>(longest, 1);
  for (std::size_t r = 0; r < size; ++r) {
    const double* p = &all[r * stride];
    if (p[1] >= 0) {
      AsyncWorker w;
      w.rank = static_cast<int>(r);
      w.worker = static_cast<int>(p[1]);
      w.step_ms = p[0];
      w.images = images;
      w.pushes = p[2];
      w.pushed_sum = p[3];
      for (std::size_t q = 0; q < size; ++q) w.applied += all[q * stride + kFields + r];
      a.workers.push_back(w);
    }
    if (p[4] >= 0) {
      AsyncServer sv;
      sv.rank = static_cast<int>(r);
      sv.shard = static_cast<int>(p[4]);
      sv.floats = p[5];
      sv.applied = p[6];
      sv.applied_sum = p[7];
      sv.staleness.assign(stale.begin() + static_cast<std::ptrdiff_t>(r * width),
                          stale.begin() + static_cast<std::ptrdiff_t>(r * width + static_cast<std::size_t>(p[8])));
      a.servers.push_back(sv);
    }
  }
  std::sort(a.workers.begin(), a.workers.end(), [](const auto& x, const auto& y) { return x.worker < y.worker; });
  std::sort(a.servers.begin(), a.servers.end(), [](const auto& x, const auto& y) { return x.shard < y.shard; });
  return a;
}

namespace {

double images_per_s(const AsyncWorker& w) { return 1000.0 * w.images / w.step_ms; }

double total_images_per_s(const AsyncReport& a) {
  double total = 0;
  for (const AsyncWorker& w : a.workers)
    if (std::isfinite(w.step_ms) && w.step_ms > 0) total += images_per_s(w);
  return total;
}

std::vector<double> all_staleness(const AsyncReport& a) {
  std::vector<double> st;
  for (const AsyncServer& s : a.servers) st.insert(st.end(), s.staleness.begin(), s.staleness.end());
  return st;
}

// Every worker's pushes reached every server once: the counts, and the sums of what was pushed and
// applied, agree.
bool each_once(const AsyncReport& a) {
  double pushed = 0, sum = 0, applied = 0, applied_sum = 0;
  for (const AsyncWorker& w : a.workers) {
    pushed += w.pushes;
    sum += w.pushed_sum;
    if (w.applied != w.pushes * static_cast<double>(a.servers.size())) return false;
  }
  for (const AsyncServer& s : a.servers) {
    applied += s.applied;
    applied_sum += s.applied_sum;
  }
  return applied == pushed * static_cast<double>(a.servers.size()) &&
         std::abs(applied_sum - sum) <= 1e-6 * (1 + std::abs(sum));
}

}  // namespace

void print_async(std::ostream& out, const Run&, const AsyncReport& a) {
  std::vector<std::string> per;
  for (const AsyncWorker& w : a.workers) per.push_back(fmt::format("{} {:.1f}", w.worker, images_per_s(w)));
  const double images = a.workers.empty() ? 0.0 : a.workers[0].images;
  out << wrap(fmt::format("asynchronous: images/s per worker ({}): {}; {:.1f} in total (each {} median step, {} "
                          "images, on its own clock)",
                          a.node_workers ? "node" : "process", fmt::join(per, ", "), total_images_per_s(a),
                          a.node_workers ? "node's first process's" : "worker's", images),
              2);
  double pushed = 0, applied = 0;
  for (const AsyncWorker& w : a.workers) pushed += w.pushes;
  for (const AsyncServer& s : a.servers) applied += s.applied;
  const std::vector<double> st = all_staleness(a);
  const std::string once =
      each_once(a) ? ", each once (their sums agree)" : " (NOT each once: the sums or counts differ)";
  const std::string applied_text =
      a.servers.size() == 1
          ? fmt::format("the server applied {} of the {} pushes{}", applied, pushed, once)
          : fmt::format("the {} servers applied {} of the {} pushed shards ({} pushes to each){}", a.servers.size(),
                        applied, pushed * static_cast<double>(a.servers.size()), pushed, once);
  out << wrap(fmt::format("  staleness: the pushing worker's {} {} updates behind the server (median), at most {}, "
                          "over {} {}; {}",
                          a.servers.size() == 1 ? "variables were" : "shard was", st.empty() ? 0.0 : median(st),
                          st.empty() ? 0.0 : *std::max_element(st.begin(), st.end()), st.size(),
                          a.servers.size() == 1 ? "pushes" : "pushed shards", applied_text),
              4);
}

nlohmann::json async_json(const Run&, const AsyncReport& a) {
  nlohmann::json workers = nlohmann::json::array();
  for (const AsyncWorker& w : a.workers) {
    nlohmann::json j{{"rank", w.rank},
                     {"step_ms", w.step_ms},
                     {"images_per_s", images_per_s(w)},
                     {"pushes", w.pushes},
                     {"pushed_sum", w.pushed_sum},
                     {"applied", w.applied},
                     {"images_per_step", w.images}};
    if (a.node_workers) j["node"] = w.worker;
    workers.push_back(j);
  }
  nlohmann::json servers = nlohmann::json::array();
  double applied = 0, applied_sum = 0;
  for (const AsyncServer& s : a.servers) {
    applied += s.applied;
    applied_sum += s.applied_sum;
    const auto& st = s.staleness;
    servers.push_back({{"rank", s.rank},
                       {"shard", s.shard},
                       {"floats", s.floats},
                       {"applied", s.applied},
                       {"applied_sum", s.applied_sum},
                       {"staleness_median", st.empty() ? 0.0 : median(st)},
                       {"staleness_max", st.empty() ? 0.0 : *std::max_element(st.begin(), st.end())}});
  }
  const std::vector<double> st = all_staleness(a);
  return {{"workers", workers},
          {"workers_are", a.node_workers ? "nodes" : "processes"},
          {"servers", servers},
          {"images_per_s", total_images_per_s(a)},
          {"applied", applied},
          {"applied_sum", applied_sum},
          {"each_once", each_once(a)},
          {"staleness_median", st.empty() ? 0.0 : median(st)},
          {"staleness_max", st.empty() ? 0.0 : *std::max_element(st.begin(), st.end())}};
}

}  // namespace stepbench
