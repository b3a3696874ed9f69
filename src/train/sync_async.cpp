// parameter_server with --cross-replica-sync off (tf_cnn_benchmarks' asynchronous parameter server):
// every process is a worker that pushes its gradients (its towers' average) to the server, process
// 0, and pulls whatever variables the server holds then, without waiting for the other workers. The
// server (host memory, a thread of its own on process 0) applies each pushed gradient once, as it
// comes, and counts how many updates behind the server the pushing worker's variables were (the
// staleness asynchronous training trades for speed). Process 0's own worker reaches the server in
// memory; the others over the group's point-to-point connection (Gloo). CPU towers.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
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

class AsyncServerSync final : public GradientSync {
 public:
  AsyncServerSync(const SyncTowers& t, const OptimizerConfig& optimizer, bool checks) : t_(t), checks_(checks) {
    if (checks_) pushed_total_.assign(t.floats, 0.0);
    if (t_.group.rank() == 0) {
      master_.assign(t.params[0], t.params[0] + t.floats);
      if (checks_) sent_hashes_.push_back(hash_of(master_.data(), t.floats));  // version 0: as built
      incoming_.resize(t.floats);
      opt_ = std::make_unique<OptimizerState>(*cpu_, optimizer, t.floats);
      for (int r = 1; r < t.group.size(); ++r) workers_.push_back(r);
      server_ = std::thread([this] { serve(); });
    }
  }
  ~AsyncServerSync() override {
    if (t_.group.rank() != 0) {
      try {
        std::int64_t head[2] = {bye, have_};
        t_.group.send(0, head, sizeof head, kPushHead);
      } catch (const std::exception&) {  // the server is gone: nothing to say goodbye to
      }
      return;
    }
    if (!server_.joinable()) return;
    // every worker says goodbye as its sync goes; one that failed never will: then the wait ends with
    // the group's timeout (0: forever). Unwinding an error, the run is ending: no wait.
    const double limit = std::uncaught_exceptions() > 0 ? 0.0
                         : t_.group.sync_timeout() > 0  ? std::max(5.0, t_.group.sync_timeout())
                                                        : 1e300;
    const auto t0 = std::chrono::steady_clock::now();
    while (!served_all() && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    // a receive is ended only once it waits: until the thread has seen stopping_, end the one it may
    // have begun since
    while (!finished_) {
      t_.group.cancel_recv();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    server_.join();
  }

  std::string name() const override {
    return fmt::format("host memory (asynchronous parameter server on process 0) + {} over {} processes",
                       t_.group.transport_name(), t_.group.size());
  }
  std::size_t bytes() const override { return t_.arena_bytes(); }
  double bus_factor() const override { return 1.0; }

  // The towers' gradients summed in host memory onto tower 0; the push is in update().
  void sync_bucket(std::size_t k) override {
    const auto [off, n] = t_.buckets[k];
    Backend& be = *t_.towers[0]->be;
    for (std::size_t i = 1; i < t_.towers.size(); ++i)
      be.add(be.default_stream(), Tensor{t_.grads[i] + off, flat_async(n)}, Tensor{t_.grads[0] + off, flat_async(n)},
             1.0f);
    be.synchronize(be.default_stream());
  }

  // Push the towers' average to the server, pull what it holds then, copy it into every tower.
  void update() override {
    float* g = t_.grads[0];
    Backend& be = *t_.towers[0]->be;
    be.scale(be.default_stream(), g, 1.0f / static_cast<float>(t_.towers.size()), t_.floats);
    be.synchronize(be.default_stream());
    pushed_sum_ += sum_of(g, t_.floats);
    ++pushes_;
    if (checks_)
      for (std::size_t i = 0; i < t_.floats; ++i) pushed_total_[i] += g[i];
    if (t_.group.rank() == 0) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!error_.empty()) throw SyncError("the asynchronous parameter server stopped: " + error_);
      }
      have_ = apply(0, have_, g, t_.params[0]);
    } else {
      const std::int64_t head[2] = {push, have_};
      t_.group.send(0, head, sizeof head, kPushHead);
      t_.group.send(0, g, t_.arena_bytes(), kPushGrads);
      std::int64_t version = 0;
      t_.group.recv({0}, &version, sizeof version, kPullHead, false);
      t_.group.recv({0}, t_.params[0], t_.arena_bytes(), kPullParams, false);
      have_ = version;
    }
    for (std::size_t i = 1; i < t_.towers.size(); ++i)
      be.copy(be.default_stream(), t_.params[i], t_.params[0], t_.arena_bytes());
    be.synchronize(be.default_stream());
  }

  void synchronize() const override { t_.synchronize_every_tower(); }
  bool asynchronous() const override { return true; }
  AsyncStats async_stats() const override {
    std::lock_guard<std::mutex> l(mu_);
    AsyncStats s;
    s.pushes = pushes_;
    s.pushed_sum = pushed_sum_;
    s.applied = applied_;
    s.applied_sum = applied_sum_;
    s.staleness = staleness_;
    s.applied_per_worker = applied_per_worker_;
    s.version = have_;
    if (checks_) {
      s.pushed_total = pushed_total_;
      s.params_hash = hash_of(t_.params[0], t_.floats);
      s.master = master_;
      s.sent_hashes = sent_hashes_;
    }
    return s;
  }
  void check_capturable() const override {
    throw UsageError("--cuda-graph cannot capture the asynchronous parameter server's messages");
  }

 private:
  // The server applies worker `w`'s gradient `g`, computed on variables of version `had`; `out` gets
  // the variables after it. Returns their version.
  std::int64_t apply(int w, std::int64_t had, const float* g, float* out) {
    std::lock_guard<std::mutex> l(mu_);
    staleness_.push_back(static_cast<double>(version_ - had));
    applied_sum_ += sum_of(g, t_.floats);
    ++applied_;
    if (applied_per_worker_.size() < static_cast<std::size_t>(t_.group.size()))
      applied_per_worker_.resize(static_cast<std::size_t>(t_.group.size()));
    ++applied_per_worker_[static_cast<std::size_t>(w)];
    auto& cs = cpu_->default_stream();
    opt_->update(cs, master_.data(), g);
    cpu_->synchronize(cs);
    std::copy(master_.begin(), master_.end(), out);
    ++version_;
    if (checks_) {  // the variables of each version, as sent
      sent_hashes_.push_back(hash_of(master_.data(), t_.floats));
    }
    return version_;
  }

  // Process 0's server thread: a push from any worker, applied, answered with the variables.
  void serve() {
    std::vector<float> reply(t_.floats);
    try {
      while (!served_all() && !stopping()) {
        std::int64_t head[2] = {0, 0};
        const int w = t_.group.recv(workers_, head, sizeof head, kPushHead, true);
        if (w < 0) break;  // cancelled
        if (head[0] == bye) {
          std::lock_guard<std::mutex> l(mu_);
          ++byes_;
          continue;
        }
        if (t_.group.recv({w}, incoming_.data(), t_.arena_bytes(), kPushGrads, false) < 0) break;
        const std::int64_t version = apply(w, head[1], incoming_.data(), reply.data());
        t_.group.send(w, &version, sizeof version, kPullHead);
        t_.group.send(w, reply.data(), t_.arena_bytes(), kPullParams);
      }
    } catch (const std::exception& e) {  // a worker that is gone: process 0's next update says so
      std::lock_guard<std::mutex> l(mu_);
      error_ = e.what();
    }
    finished_ = true;
  }
  bool served_all() const {
    std::lock_guard<std::mutex> l(mu_);
    return byes_ == static_cast<int>(workers_.size()) || !error_.empty();
  }
  bool stopping() const {
    std::lock_guard<std::mutex> l(mu_);
    return stopping_;
  }
  static std::uint64_t hash_of(const float* p, std::size_t n) {
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t b;
      std::memcpy(&b, p + i, 4);
      h = (h ^ b) * 1099511628211ull;
    }
    return h;
  }

  SyncTowers t_;
  std::unique_ptr<Backend> cpu_ = make_backend(BackendKind::cpu);
  std::unique_ptr<OptimizerState> opt_;
  std::vector<float> master_, incoming_;
  std::vector<int> workers_;  // the ranks that push over the connection: all but 0
  std::thread server_;
  mutable std::mutex mu_;
  std::int64_t version_ = 0;  // updates the server applied
  std::int64_t have_ = 0;     // the version of this worker's variables
  long pushes_ = 0, applied_ = 0;
  double pushed_sum_ = 0, applied_sum_ = 0;
  std::vector<double> staleness_;
  std::vector<long> applied_per_worker_;
  int byes_ = 0;
  bool stopping_ = false;
  std::atomic<bool> finished_{false};  // the server thread returned
  std::string error_;
  bool checks_;                             // TowerOptions::async_checks
  std::vector<double> pushed_total_;        // with checks: every pushed gradient, element by element
  std::vector<std::uint64_t> sent_hashes_;  // with checks, process 0: the variables of each version
};

}  // namespace

std::unique_ptr<GradientSync> make_async_server_sync(const SyncTowers& t, const OptimizerConfig& optimizer,
                                                     bool checks) {
  return std::make_unique<AsyncServerSync>(t, optimizer, checks);
}

}  // namespace stepbench
