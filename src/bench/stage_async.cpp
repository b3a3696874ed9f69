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
constexpr std::size_t kWorker = 4;  // per process in the first gather: median step, worker, pushes, their sum
constexpr std::size_t kServer = 5;  // in the second: shard, floats, applied, their sum, the largest staleness;
                                    // then applied_per_worker
}  // namespace

std::optional<AsyncReport> gather_async(Run& run) {
  if (!run.towers->asynchronous()) return std::nullopt;
  // this process's timed steps: the last --repetitions calls of the step fixture
  std::vector<double> mine;
  const auto& calls = run.step_samples;
  const std::size_t reps = static_cast<std::size_t>(std::max(run.c.repetitions, 1));
  for (std::size_t c = calls.size() > reps ? calls.size() - reps : 0; c < calls.size(); ++c)
    mine.insert(mine.end(), calls[c].begin(), calls[c].end());
  const AsyncStats w = run.towers->async_stats();
  const auto size = static_cast<std::size_t>(run.group.size());
  const std::vector<double> workers = run.group.allgather(std::vector<double>{
      mine.empty() ? NAN : median(mine), static_cast<double>(w.worker), static_cast<double>(w.pushes), w.pushed_sum});
  // A push returns once its server applied it, so with every process past that gather the servers have
  // applied every push: their counts are read now.
  const AsyncStats s = run.towers->async_stats();
  double most = 0;
  for (double x : s.staleness) most = std::max(most, x);
  std::vector<double> v{static_cast<double>(s.serves), static_cast<double>(s.shard_floats),
                        static_cast<double>(s.applied), s.applied_sum, most};
  for (std::size_t r = 0; r < size; ++r)
    v.push_back(r < s.applied_per_worker.size() ? static_cast<double>(s.applied_per_worker[r]) : 0.0);
  const std::vector<double> servers = run.group.allgather(v);
  const std::size_t stride = kServer + size;
  // each server's staleness as counts per value (0 .. the largest anywhere): bounded by the updates
  // a worker can fall behind, not by the run's length
  std::size_t width = 1;
  for (std::size_t r = 0; r < size; ++r) width = std::max(width, static_cast<std::size_t>(servers[r * stride + 4]) + 1);
  std::vector<double> counts(width, 0.0);
  for (double x : s.staleness) counts[static_cast<std::size_t>(x)] += 1;
  const std::vector<double> stale = run.group.allgather(counts);
  if (!run.root) return std::nullopt;

  AsyncReport a;
  a.node_workers = w.node_workers;
  const double images = static_cast<double>(run.c.run.batch_per_tower * run.towers->size()) *
                        (w.node_workers ? run.group.within_node().size() : 1);
  for (std::size_t r = 0; r < size; ++r) {
    const double* p = &workers[r * kWorker];
    const double* q = &servers[r * stride];
    if (p[1] >= 0) {
      AsyncWorker aw;
      aw.rank = static_cast<int>(r);
      aw.worker = static_cast<int>(p[1]);
      aw.step_ms = p[0];
      aw.images = images;
      aw.pushes = p[2];
      aw.pushed_sum = p[3];
      for (std::size_t o = 0; o < size; ++o) aw.applied += servers[o * stride + kServer + r];
      a.workers.push_back(aw);
    }
    if (q[0] >= 0) {
      AsyncServer sv;
      sv.rank = static_cast<int>(r);
      sv.shard = static_cast<int>(q[0]);
      sv.floats = q[1];
      sv.applied = q[2];
      sv.applied_sum = q[3];
      sv.staleness_counts.assign(stale.begin() + static_cast<std::ptrdiff_t>(r * width),
                                 stale.begin() + static_cast<std::ptrdiff_t>((r + 1) * width));
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

// The staleness of every shard applied, as counts per value: summed over the servers, and its count,
// median and largest value.
std::vector<double> all_staleness(const AsyncReport& a) {
  std::vector<double> c;
  for (const AsyncServer& s : a.servers) {
    c.resize(std::max(c.size(), s.staleness_counts.size()), 0.0);
    for (std::size_t i = 0; i < s.staleness_counts.size(); ++i) c[i] += s.staleness_counts[i];
  }
  return c;
}
double count_of(const std::vector<double>& c) { return std::accumulate(c.begin(), c.end(), 0.0); }
// the value of rank k (0-based) in the sorted values the counts stand for
double at_rank(const std::vector<double>& c, double k) {
  double seen = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    seen += c[i];
    if (seen > k) return static_cast<double>(i);
  }
  return 0;
}
double median_of(const std::vector<double>& c) {
  const double n = count_of(c);
  if (n == 0) return 0;
  return 0.5 * (at_rank(c, std::floor((n - 1) / 2)) + at_rank(c, std::ceil((n - 1) / 2)));
}
double max_of(const std::vector<double>& c) {
  for (std::size_t i = c.size(); i-- > 0;)
    if (c[i] > 0) return static_cast<double>(i);
  return 0;
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
                          a.servers.size() == 1 ? "variables were" : "shard was", median_of(st), max_of(st),
                          count_of(st), a.servers.size() == 1 ? "pushes" : "pushed shards", applied_text),
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
    const auto& st = s.staleness_counts;
    servers.push_back({{"rank", s.rank},
                       {"shard", s.shard},
                       {"floats", s.floats},
                       {"applied", s.applied},
                       {"applied_sum", s.applied_sum},
                       {"staleness_median", median_of(st)},
                       {"staleness_max", max_of(st)}});
  }
  const std::vector<double> st = all_staleness(a);
  return {{"workers", workers},          {"workers_are", a.node_workers ? "nodes" : "processes"},
          {"servers", servers},          {"images_per_s", total_images_per_s(a)},
          {"applied", applied},          {"applied_sum", applied_sum},
          {"each_once", each_once(a)},   {"staleness_median", median_of(st)},
          {"staleness_max", max_of(st)}, {"staleness_counts", st}};
}

}  // namespace stepbench
