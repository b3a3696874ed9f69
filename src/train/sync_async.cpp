// --cross-replica-sync off (tf_cnn_benchmarks' asynchronous parameter servers): each worker pushes its
// gradients to the servers and pulls whatever variables they hold then, without waiting for the
// other workers.
//   parameter_server: every process is a worker (its towers' average); one server, on process 0.
//   distributed_replicated: every node is a worker, as one tf_cnn_benchmarks worker with several GPUs:
//     its processes sum their towers' gradients onto the node's first process, in step with each
//     other; that process pushes each server its shard and pulls every shard back, then hands the
//     variables to the rest of the node. --ps-ranks K servers, server s the first process of node
//     s x nodes / K, owning the s-th contiguous K-th of the variables (as the synchronous mode).
// A server (host memory) applies each pushed shard once, as it comes, and records how many of its
// updates behind it the pushing worker's shard was (the staleness asynchronous training trades for
// speed). It answers each other worker on a thread of its own: a receive from that one rank, which
// fails as soon as its connection closes, so that a dead worker ends the run, named, at the server's
// next step (a receive from any of several ranks is not woken by one of them closing). A worker
// reaches the server on its own process in memory, the others over the group's point-to-point
// connection (Gloo), one server after the other: a worker then waits on one server at a time and
// each server thread on one worker, so that no cycle of waits can form. CPU towers.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "tensor/error.hpp"
#include "train/sync.hpp"

namespace stepbench {
namespace {

constexpr std::uint64_t kPushHead = 0x5342505348ull, kPushGrads = 0x5342505347ull;  // slots of their own
constexpr std::uint64_t kPullHead = 0x5342504c48ull, kPullParams = 0x5342504c50ull;
enum Kind : std::int64_t { push = 1, bye = 2 };

TensorDesc flat_async(std::size_t count) {
  return TensorDesc::dense(Shape{1, static_cast<std::int64_t>(count), 1, 1}, DType::f32, Layout::nchw);
}

double sum_of(const float* p, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

std::uint64_t hash_of(const float* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, p + i, 4);
    h = (h ^ b) * 1099511628211ull;
  }
  return h;
}

class AsyncServerSync final : public GradientSync {
 public:
  AsyncServerSync(const SyncTowers& t, const OptimizerConfig& optimizer, bool checks, int servers, bool by_node)
      : t_(t), in_(by_node ? &t.group.within_node() : nullptr), servers_(servers), checks_(checks) {
    const ProcessGroup& g = t.group;
    pusher_ = !in_ || in_->rank() == 0;
    worker_ = in_ ? g.across_nodes().rank() : g.rank();
    const int workers = in_ ? g.across_nodes().size() : g.size();
    // every process's worker, and whether it pushes for it: who serves, and whom a server hears from
    const std::vector<double> all = g.allgather(std::vector<double>{static_cast<double>(worker_), pusher_ ? 1.0 : 0.0});
    server_rank_.assign(static_cast<std::size_t>(servers_), -1);
    for (int r = 0; r < g.size(); ++r) {
      const auto i = 2 * static_cast<std::size_t>(r);
      if (all[i + 1] == 0) continue;
      for (int s = 0; s < servers_; ++s)
        if (static_cast<int>(all[i]) == s * workers / servers_) server_rank_[static_cast<std::size_t>(s)] = r;
      if (r != g.rank()) others_.push_back(r);
    }
    for (int s = 0; s < servers_; ++s) {
      if (server_rank_[static_cast<std::size_t>(s)] < 0)
        throw Error(fmt::format("asynchronous parameter server {} has no process", s));
      if (server_rank_[static_cast<std::size_t>(s)] == g.rank()) mine_ = s;
    }
    have_.assign(static_cast<std::size_t>(servers_), 0);
    broken_.assign(static_cast<std::size_t>(servers_), false);
    if (checks_ && pusher_) pushed_total_.assign(t.floats, 0.0);
    if (in_)
      timer_.levels = {
          {"node_reduce", "sum within each node", 0, 0, in_->size() > 1 ? 1.0 : 0.0, 0},
          {"push_pull", "push to and pull from the parameter servers", 0, 0, 1.0, 0},
          {"node_broadcast", "from each node's first process to the rest", 0, 0, in_->size() > 1 ? 1.0 : 0.0, 0}};
    if (mine_ >= 0) {
      const auto [b, n] = shard(mine_);
      master_.assign(t.params[0] + b, t.params[0] + b + n);
      if (checks_) sent_hashes_.push_back(hash_of(master_.data(), n));  // version 0: as built
      opt_ = std::make_unique<OptimizerState>(*cpu_, optimizer, n);
      applied_per_worker_.assign(static_cast<std::size_t>(g.size()), 0);
      try {
        for (int w : others_) server_.emplace_back([this, w] { serve(w); });
      } catch (...) {  // a thread that could not start: end those that did
        stop_serving();
        throw;
      }
    }
  }
  ~AsyncServerSync() override {
    if (pusher_)
      for (int s = 0; s < servers_; ++s) {
        // a server whose round trip broke part-way may still be answering: no goodbye to wait on it
        if (s == mine_ || broken_[static_cast<std::size_t>(s)]) continue;
        try {
          const std::int64_t head[2] = {bye, 0};
          t_.group.send(server_rank_[static_cast<std::size_t>(s)], head, sizeof head, kPushHead);
        } catch (const std::exception&) {  // the server is gone: nothing to say goodbye to
        }
      }
    if (server_.empty()) return;
    // every other worker says goodbye as its sync goes; one that failed never will: then the wait ends
    // with the group's timeout (0: forever). Unwinding an error, the run is ending: no wait.
    const double limit = std::uncaught_exceptions() > 0 ? 0.0
                         : t_.group.sync_timeout() > 0  ? std::max(5.0, t_.group.sync_timeout())
                                                        : 1e300;
    const auto t0 = std::chrono::steady_clock::now();
    while (!served_all() && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stop_serving();
  }

  std::string name() const override {
    if (!in_)
      return fmt::format("host memory (asynchronous parameter server on process 0) + {} over {} processes",
                         t_.group.transport_name(), t_.group.size());
    return fmt::format(
        "host memory within each node, then asynchronous pushes to {} parameter server{} + {} ({} node{} x {} "
        "process{})",
        servers_, servers_ == 1 ? "" : "s", t_.group.transport_name(), t_.group.across_nodes().size(),
        t_.group.across_nodes().size() == 1 ? "" : "s", in_->size(), in_->size() == 1 ? "" : "es");
  }
  std::size_t bytes() const override { return t_.arena_bytes(); }
  double bus_factor() const override { return 1.0; }
  std::vector<SyncLevel> levels() const override { return timer_.levels; }
  void trace_levels(bool on) override { timer_.trace(on); }
  std::vector<LevelSpan> take_level_spans() override { return timer_.take_spans(); }

  // The towers' sum in host memory onto tower 0, the node's onto its first process, made the
  // worker's average (kept bounded where grad_sync runs alone, over and over); the push is in update().
  void sync_bucket(std::size_t k) override {
    const std::size_t off = t_.buckets[k].first, n = t_.buckets[k].second;  // captured below
    Backend& be = *t_.towers[0]->be;
    float* sum = t_.grads[0] + off;
    for (std::size_t i = 1; i < t_.towers.size(); ++i)
      be.add(be.default_stream(), Tensor{t_.grads[i] + off, flat_async(n)}, Tensor{sum, flat_async(n)}, 1.0f);
    be.synchronize(be.default_stream());
    if (in_) timer_.timed(0, static_cast<double>(n * sizeof(float)), [&] { in_->reduce_sum_to(sum, n, 0); });
    const std::size_t each = t_.towers.size() * static_cast<std::size_t>(in_ ? in_->size() : 1);
    be.scale(be.default_stream(), sum, 1.0f / static_cast<float>(each), n);
    be.synchronize(be.default_stream());
  }

  // The worker's pusher pushes every server its shard of the average and pulls the shard it holds
  // then, one server after the other; the rest of a node gets the variables from its first process;
  // every tower copies them in.
  void update() override {
    float* g = t_.grads[0];
    float* p = t_.params[0];
    if (pusher_) {
      pushed_sum_ += sum_of(g, t_.floats);
      ++pushes_;
      if (checks_) {
        for (std::size_t i = 0; i < t_.floats; ++i) pushed_total_[i] += g[i];
        if (pushes_ == 1) first_push_.assign(g, g + t_.floats);
      }
      auto exchange = [&] {
        for (int s = 0; s < servers_; ++s) {
          const auto [b, n] = shard(s);
          auto& have = have_[static_cast<std::size_t>(s)];
          if (s == mine_) {
            {
              std::lock_guard<std::mutex> l(mu_);
              if (!error_.empty()) throw SyncError("the asynchronous parameter server stopped: " + error_);
            }
            have = apply(t_.group.rank(), have, g + b, p + b);
            continue;
          }
          const int to = server_rank_[static_cast<std::size_t>(s)];
          const std::int64_t head[2] = {push, have};
          broken_[static_cast<std::size_t>(s)] = true;  // until the round trip is whole
          t_.group.send(to, head, sizeof head, kPushHead);
          t_.group.send(to, g + b, n * sizeof(float), kPushGrads);
          std::int64_t version = 0;
          t_.group.recv({to}, &version, sizeof version, kPullHead, false);
          t_.group.recv({to}, p + b, n * sizeof(float), kPullParams, false);
          broken_[static_cast<std::size_t>(s)] = false;
          have = version;
        }
      };
      if (in_)
        timer_.timed(1, 2.0 * static_cast<double>(t_.arena_bytes()), exchange);
      else
        exchange();
    }
    if (in_) timer_.timed(2, static_cast<double>(t_.arena_bytes()), [&] { in_->broadcast_from(p, t_.floats, 0); });
    Backend& be = *t_.towers[0]->be;
    for (std::size_t i = 1; i < t_.towers.size(); ++i) be.copy(be.default_stream(), t_.params[i], p, t_.arena_bytes());
    be.synchronize(be.default_stream());
  }

  void synchronize() const override { t_.synchronize_every_tower(); }
  bool asynchronous() const override { return true; }
  AsyncStats async_stats() const override {
    std::lock_guard<std::mutex> l(mu_);
    AsyncStats s;
    s.worker = pusher_ ? worker_ : -1;
    s.node_workers = in_ != nullptr;
    s.servers = servers_;
    s.serves = mine_;
    s.shard_floats = mine_ >= 0 ? master_.size() : 0;
    s.pushes = pushes_;
    s.pushed_sum = pushed_sum_;
    s.versions.assign(have_.begin(), have_.end());
    s.applied = applied_;
    s.applied_sum = applied_sum_;
    s.staleness = staleness_;
    s.applied_per_worker = applied_per_worker_;
    if (checks_) {
      s.pushed_total = pushed_total_;
      s.first_push = first_push_;
      for (int k = 0; k < servers_; ++k) {
        const auto [b, n] = shard(k);
        s.shard_hashes.push_back(hash_of(t_.params[0] + b, n));
      }
      s.master = master_;
      s.sent_hashes = sent_hashes_;
    }
    return s;
  }
  void check_capturable() const override {
    throw UsageError("--cuda-graph cannot capture the asynchronous parameter server's messages");
  }

 private:
  // Server s's shard: [F s / K, F (s + 1) / K), as (begin, floats).
  std::pair<std::size_t, std::size_t> shard(int s) const {
    const auto k = static_cast<std::size_t>(servers_);
    const auto b = t_.floats * static_cast<std::size_t>(s) / k;
    return {b, t_.floats * static_cast<std::size_t>(s + 1) / k - b};
  }

  // This process's server applies the shard `g` that rank `from` pushed, computed on the shard's
  // version `had`; `out` (which may be `g`) gets the shard after it. Returns its version.
  std::int64_t apply(int from, std::int64_t had, const float* g, float* out) {
    std::lock_guard<std::mutex> l(mu_);
    staleness_.push_back(static_cast<double>(version_ - had));
    applied_sum_ += sum_of(g, master_.size());  // g is read before out is written
    ++applied_;
    ++applied_per_worker_[static_cast<std::size_t>(from)];
    auto& cs = cpu_->default_stream();
    opt_->update(cs, master_.data(), g);
    cpu_->synchronize(cs);
    std::copy(master_.begin(), master_.end(), out);
    ++version_;
    if (checks_) sent_hashes_.push_back(hash_of(master_.data(), master_.size()));  // each version, as sent
    return version_;
  }

  // The server's thread for the pusher of rank w: its pushes, each applied and answered with the shard,
  // until it says goodbye. The pushed shard is received into the buffer the answer then goes from.
  void serve(int w) {
    std::vector<float> buf(master_.size());
    const std::size_t bytes = buf.size() * sizeof(float);
    try {
      while (!stopping()) {
        std::int64_t head[2] = {0, 0};
        if (t_.group.recv({w}, head, sizeof head, kPushHead, true) < 0) break;  // cancelled
        if (head[0] == bye) {
          std::lock_guard<std::mutex> l(mu_);
          ++byes_;
          break;
        }
        if (t_.group.recv({w}, buf.data(), bytes, kPushGrads, false) < 0) break;
        const std::int64_t version = apply(w, head[1], buf.data(), buf.data());
        t_.group.send(w, &version, sizeof version, kPullHead);
        t_.group.send(w, buf.data(), bytes, kPullParams);
      }
    } catch (const std::exception& e) {  // a worker that is gone: this process's next update says so
      std::lock_guard<std::mutex> l(mu_);
      if (error_.empty()) error_ = e.what();
    }
    ++finished_;
  }
  // Ends the server threads: each sees stopping_, and the receive each may be waiting in is cancelled
  // (a receive is ended only once it waits, so until every thread has returned).
  void stop_serving() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    while (finished_ < server_.size()) {
      t_.group.cancel_recv();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (std::thread& th : server_) th.join();
  }
  bool served_all() const {
    std::lock_guard<std::mutex> l(mu_);
    return byes_ == static_cast<int>(others_.size()) || !error_.empty();
  }
  bool stopping() const {
    std::lock_guard<std::mutex> l(mu_);
    return stopping_;
  }

  SyncTowers t_;
  const ProcessGroup* in_;  // distributed_replicated: this process's node; nullptr: each process a worker
  int servers_;
  bool pusher_ = true;            // this process pushes for its worker
  int worker_ = 0;                // its worker: its rank, or its node
  int mine_ = -1;                 // the shard this process serves, or -1
  std::vector<int> server_rank_;  // per server: the process it runs on
  std::vector<int> others_;       // the ranks of the other pushers: whom a server hears from
  std::unique_ptr<Backend> cpu_ = make_backend(BackendKind::cpu);
  std::unique_ptr<OptimizerState> opt_;
  std::vector<float> master_;        // the served shard
  std::vector<std::thread> server_;  // one per other pusher
  mutable std::mutex mu_;
  std::int64_t version_ = 0;        // updates the server applied
  std::vector<std::int64_t> have_;  // per server: the version of this worker's shard
  std::vector<bool> broken_;        // per server: a round trip that failed part-way
  long pushes_ = 0, applied_ = 0;
  double pushed_sum_ = 0, applied_sum_ = 0;
  std::vector<double> staleness_;
  std::vector<long> applied_per_worker_;
  int byes_ = 0;
  bool stopping_ = false;
  std::atomic<std::size_t> finished_{0};  // the server threads that returned
  std::string error_;
  bool checks_;                             // TowerOptions::async_checks
  std::vector<double> pushed_total_;        // with checks: every pushed gradient, element by element
  std::vector<float> first_push_;           // with checks: the first, as pushed
  std::vector<std::uint64_t> sent_hashes_;  // with checks, a server: its shard at each version
  LevelTimer timer_;                        // distributed_replicated's levels
};

}  // namespace

std::unique_ptr<GradientSync> make_async_server_sync(const SyncTowers& t, const OptimizerConfig& optimizer, bool checks,
                                                     int servers, bool node_workers) {
  return std::make_unique<AsyncServerSync>(t, optimizer, checks, servers, node_workers);
}

}  // namespace stepbench
