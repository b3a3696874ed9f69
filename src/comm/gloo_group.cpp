// ProcessGroup's Gloo transport (built with STEPBENCH_GLOO): the processes meet on a store
// (comm/store.hpp; stepbench's checks in comm/rendezvous.cpp first), then Gloo connects every pair
// over TCP (its full mesh, as PyTorch's ProcessGroupGloo does) and runs the host collectives with
// the group's timeout. The store is needed only for the meeting: rank 0 clears it once all have met.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/rendezvous.hpp"
#include "comm/store.hpp"
#include "comm/transport.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

std::chrono::milliseconds as_timeout(double s) {
  // 0 waits forever: ten years is Gloo's forever
  return s > 0 ? std::chrono::milliseconds(static_cast<std::int64_t>(s * 1e3) + 1) : std::chrono::hours(24 * 3650);
}

// Gloo's rendezvous keys on stepbench's store, under a prefix; a missing key after the timeout names its rank.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(stepbench::Store& s, double timeout_s) : s_(s), timeout_s_(timeout_s) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_.set("gloo/" + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    const std::string v = *s_.try_get("gloo/" + key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, as_timeout(timeout_s_)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back("gloo/" + k);
    const auto missing = s_.wait(full, static_cast<double>(timeout.count()) / 1e3);
    if (!missing.empty()) {
      std::string who = missing[0].substr(5);  // Gloo's key: the rank, or "rank_" and the rank
      if (who.rfind("rank_", 0) == 0) who = who.substr(5);
      throw SyncError(fmt::format("rank {} did not publish its Gloo address on {} within {:g} s (it ended?)", who,
                                  s_.address(), timeout_s_));
    }
  }

 private:
  stepbench::Store& s_;
  double timeout_s_;
};

class GlooTransport final : public Transport {
 public:
  explicit GlooTransport(std::shared_ptr<gloo::rendezvous::Context> ctx) : ctx_(std::move(ctx)) {}
  std::string name() const override { return "Gloo"; }
  void abort(int) override {
    std::lock_guard<std::mutex> l(mu_);
    ctx_.reset();  // closes every pair: the others' next collective fails at once
  }

  void allreduce_max(const ProcessGroup& pg, double* v, std::size_t n) override {
    allreduce(pg, "an all-reduce among the processes (Gloo)", v, n, &gloo::max<double>);
  }
  void allreduce_sum(const ProcessGroup& pg, float* data, std::size_t count) override {
    allreduce(pg, "the gradient all-reduce (Gloo)", data, count, &gloo::sum<float>);
  }
  void reduce_sum_to_root(const ProcessGroup& pg, float* data, std::size_t count) override {
    run(pg, "the gradient reduce to the parameter server (Gloo)", [&](const std::shared_ptr<gloo::Context>& c, auto t) {
      gloo::ReduceOptions o(c);
      o.setOutput(data, count);
      o.setRoot(0);
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      o.setTimeout(t);
      gloo::reduce(o);
    });
  }
  void broadcast_bytes(const ProcessGroup& pg, void* data, std::size_t bytes) override {
    run(pg, "a broadcast from process 0 (Gloo)", [&](const std::shared_ptr<gloo::Context>& c, auto t) {
      gloo::BroadcastOptions o(c);
      o.setOutput(static_cast<char*>(data), bytes);
      o.setRoot(0);
      o.setTimeout(t);
      gloo::broadcast(o);
    });
  }
  void allgather_bytes(const ProcessGroup& pg, const void* mine, std::size_t bytes, void* all) override {
    run(pg, "an all-gather (Gloo)", [&](const std::shared_ptr<gloo::Context>& c, auto t) {
      gloo::AllgatherOptions o(c);
      o.setInput(const_cast<char*>(static_cast<const char*>(mine)), bytes);
      o.setOutput(static_cast<char*>(all), bytes * static_cast<std::size_t>(c->size));
      o.setTimeout(t);
      gloo::allgather(o);
    });
  }
  void barrier(int rank, int size, double timeout_s) {
    run("a barrier (Gloo)", rank, size, timeout_s, [&](const std::shared_ptr<gloo::Context>& c, auto t) {
      gloo::BarrierOptions o(c);
      o.setTimeout(t);
      gloo::barrier(o);
    });
  }
  // Every peer sends this rank a token and is sent one; those whose token did not come within
  // window_s stalled or ended. The context is spent afterwards (a timed-out wait closes every pair).
  std::vector<int> silent_peers(const ProcessGroup& pg, double window_s) override {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<int> silent;
    if (!ctx_) return silent;
    constexpr std::uint64_t kSlot = 0x5354455042454e43ull;  // a slot of its own, far from the collectives'
    const int n = ctx_->size, me = ctx_->rank;
    std::vector<int> in(static_cast<std::size_t>(n), 0), out(static_cast<std::size_t>(n), 1);
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> rx, tx;
    try {
      for (int r = 0; r < n; ++r) {
        rx.push_back(ctx_->createUnboundBuffer(&in[static_cast<std::size_t>(r)], sizeof(int)));
        tx.push_back(ctx_->createUnboundBuffer(&out[static_cast<std::size_t>(r)], sizeof(int)));
        if (r == me) continue;
        rx.back()->recv(r, kSlot);
        tx.back()->send(r, kSlot);
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(window_s));
    } catch (const std::exception&) {  // the connections are gone: everyone is silent to us
    }
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      try {
        if (static_cast<std::size_t>(r) >= rx.size() ||
            !rx[static_cast<std::size_t>(r)]->waitRecv(std::chrono::milliseconds(1)))
          silent.push_back(r);
      } catch (const std::exception&) {
        silent.push_back(r);
      }
    }
    ctx_.reset();
    (void)pg;
    return silent;
  }

 private:
  // One collective at a time (the communication thread and the main thread share the group), its
  // failures as SyncError saying whether it timed out or a peer went away.
  // An all-reduce of n values in place with Gloo's element-wise reduce function f.
  template <class T>
  void allreduce(const ProcessGroup& pg, const char* what, T* data, std::size_t n,
                 void (*f)(void*, const void*, const void*, size_t)) {
    run(pg, what, [&](const std::shared_ptr<gloo::Context>& c, auto t) {
      gloo::AllreduceOptions o(c);
      o.setOutput(data, n);
      o.setReduceFunction(f);
      o.setTimeout(t);
      gloo::allreduce(o);
    });
  }
  template <class F>
  void run(const ProcessGroup& pg, const char* what, F&& f) {
    run(what, pg.rank(), pg.size(), pg.sync_timeout(), std::forward<F>(f));
  }
  template <class F>
  void run(const char* what, int rank, int size, double limit, F&& f) {
    std::lock_guard<std::mutex> l(mu_);
    if (!ctx_) throw SyncError(fmt::format("{}: the group was ended after an earlier failure", what));
    std::string why;
    try {
      f(std::static_pointer_cast<gloo::Context>(ctx_), as_timeout(limit));
      return;
    } catch (const gloo::Exception& e) {
      why = e.what();
    } catch (const gloo::EnforceNotMet& e) {  // Gloo's own checks (a pair not connected) are not gloo::Exception
      why = e.what();
    }
    ctx_.reset();  // a failed collective leaves its pairs in no known state
    if (why.find("Timed out") != std::string::npos)
      throw SyncError(fmt::format(
          "{} did not complete within {:g} s on process {} of {}: another process failed or stalled. If the step "
          "is legitimately that slow, raise --sync-timeout-s (0 waits forever)",
          what, limit, rank, size));
    throw SyncError(fmt::format("{} failed on process {} of {}: another process ended or dropped its connection ({})",
                                what, rank, size, why));
  }
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::mutex mu_;
};

std::string host_name() {
  char h[256] = {};
  gethostname(h, sizeof h - 1);
  return h;
}

// The address Gloo listens on: loopback when every process is on this node; else the local
// address that routes to the store's host (a connected UDP socket sends nothing); else the host name.
std::string gloo_address(const LaunchEnv& env) {
  if (env.local_size == env.size) return "127.0.0.1";
  if (env.rendezvous.rfind("tcp://", 0) == 0) {
    const auto colon = env.rendezvous.rfind(':');
    const std::string host = env.rendezvous.substr(6, colon - 6);
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(host.c_str(), env.rendezvous.substr(colon + 1).c_str(), &hints, &res) == 0) {
      std::string out;
      const int fd = socket(res->ai_family, SOCK_DGRAM, 0);
      sockaddr_storage me{};
      socklen_t len = sizeof me;
      char buf[INET6_ADDRSTRLEN] = {};
      if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
          getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
          getnameinfo(reinterpret_cast<sockaddr*>(&me), len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) == 0)
        out = buf;
      if (fd >= 0) close(fd);
      freeaddrinfo(res);
      if (!out.empty()) return out;
    }
  }
  return host_name();  // it must resolve to an address the others reach (Debian's 127.0.1.1 does not)
}

}  // namespace

bool built_with_gloo() { return true; }

// The store, served by rank 0 for tcp. A rank 0 that finds the port taken may be a second process
// told it is rank 0: it asks the server there whether rank 0 was claimed.
std::unique_ptr<stepbench::Store> open_for(const LaunchEnv& env, double timeout_s) {
  try {
    return open_store(env.rendezvous, env.rank == 0, timeout_s);
  } catch (const UsageError& taken) {
    if (env.rank != 0 || env.rendezvous.rfind("tcp://", 0) != 0) throw;
    std::unique_ptr<stepbench::Store> other;
    try {
      other = open_store(env.rendezvous, false, 2);
    } catch (const Error&) {
      throw taken;  // nobody stepbench's there: the port is someone else's
    }
    if (other->try_get("stepbench/claim/0"))
      throw UsageError(fmt::format("two processes were given rank 0 ({}): give each process its own rank", env.source));
    throw taken;
  }
}

Joined join_gloo(const LaunchEnv& env, double timeout_s) {
  auto store = open_for(env, timeout_s);
  Joined j;
  j.rank = env.rank;
  j.size = env.size;
  j.local_rank = env.local_rank;
  j.local_size = env.local_size;
  try {
    j.peers = meet(*store, env, host_name(), timeout_s);
  } catch (const UsageError&) {
    // rank 0 serves a tcp store: it stays up a moment so that the others read why and end with it
    if (env.rank == 0 && env.rendezvous.rfind("tcp://", 0) == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    throw;
  }
  gloo::transport::tcp::attr attr;
  attr.hostname = gloo_address(env);
  std::shared_ptr<gloo::transport::Device> dev;
  try {
    dev = gloo::transport::tcp::CreateDevice(attr);
  } catch (const gloo::Exception& e) {
    throw UsageError(
        fmt::format("Gloo cannot listen on {} ({}): check that this host's name resolves to an "
                    "address the other processes reach",
                    attr.hostname, e.what()));
  }
  auto ctx = std::make_shared<gloo::rendezvous::Context>(env.rank, env.size);
  ctx->setTimeout(as_timeout(timeout_s));
  GlooStore gs(*store, timeout_s);
  // Gloo waits up to 5 x its timeout for a pair to connect: a fifth while connecting, so that a
  // stalled peer ends the meeting within the timeout
  ctx->setTimeout(timeout_s > 0 ? as_timeout(std::max(timeout_s / 5, 1.0)) : as_timeout(0));
  try {
    ctx->connectFullMesh(gs, dev);
  } catch (const gloo::Exception& e) {
    throw SyncError(fmt::format("Gloo could not connect rank {} to the others ({})", env.rank, e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    throw SyncError(fmt::format("Gloo could not connect rank {} to the others ({})", env.rank, e.what()));
  }
  ctx->setTimeout(as_timeout(timeout_s));
  auto t = std::make_unique<GlooTransport>(ctx);
  t->barrier(env.rank, env.size, timeout_s);  // every rank is connected: the store has served its purpose
  if (env.rank == 0) store->clear();
  j.transport = std::move(t);
  return j;
}

}  // namespace stepbench
