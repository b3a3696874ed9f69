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

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/gloo_liveness.hpp"
#include "comm/rendezvous.hpp"
#include "comm/store.hpp"
#include "comm/transport.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

// Gloo's rendezvous keys on stepbench's store, under a prefix (one per context); a missing key after
// the timeout names its rank.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(stepbench::Store& s, double timeout_s, std::string prefix)
      : s_(s), timeout_s_(timeout_s), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    const std::string v = *s_.try_get(prefix_ + key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, gloo_live::as_timeout(timeout_s_)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    const auto missing = s_.wait(full, static_cast<double>(timeout.count()) / 1e3);
    if (!missing.empty()) {
      std::string who = missing[0].substr(prefix_.size());  // Gloo's key: the rank, or "rank_" and the rank
      if (who.rfind("rank_", 0) == 0) who = who.substr(5);
      throw SyncError(fmt::format("rank {} did not publish its Gloo address on {} within {:g} s (it ended?)", who,
                                  s_.address(), timeout_s_));
    }
  }

 private:
  stepbench::Store& s_;
  double timeout_s_;
  std::string prefix_;
};

// Three full meshes: ctx_ carries the collectives, p2p_ (where asked) the messages, and live_ the
// liveness asks that name a silent rank after a call failed; each process answers those on a thread.
class GlooTransport final : public Transport {
 public:
  // state: the process's one CallState, shared with its level transports
  GlooTransport(std::shared_ptr<gloo::rendezvous::Context> ctx, std::shared_ptr<gloo::rendezvous::Context> live,
                std::shared_ptr<gloo_live::CallState> state)
      : state_(std::move(state)),
        ctx_(std::move(ctx)),
        live_(std::make_unique<gloo_live::Liveness>(std::move(live), *state_)) {}
  std::string name() const override { return "Gloo"; }
  // Not under mu_, which a collective in flight holds: the others fail at once on the closed pairs,
  // the call in flight here ends within its timeout (the process is ending; with --sync-timeout-s 0
  // it does not end: its own wait is not woken by the closed pairs).
  void abort(int) override {
    std::shared_ptr<gloo::rendezvous::Context> c;
    {
      std::lock_guard<std::mutex> l(ptr_mu_);
      c = std::move(ctx_);
    }
    state_->fail();
    if (c) gloo_live::break_all(*c);  // the others' calls fail at once
    if (p2p_) gloo_live::break_all(*p2p_);
  }

  void allreduce_max(const ProcessGroup& pg, double* v, std::size_t n) override {
    allreduce(pg, "an all-reduce among the processes (Gloo)", v, n, &gloo::max<double>);
  }
  void allreduce_sum(const ProcessGroup& pg, float* data, std::size_t count) override {
    allreduce(pg, "the gradient all-reduce (Gloo)", data, count, &gloo::sum<float>);
  }
  void reduce_sum_to(const ProcessGroup& pg, float* data, std::size_t count, int root) override {
    run(pg, root == 0 ? "the gradient reduce to the parameter server (Gloo)" : "a gradient reduce (Gloo)",
        [&](const std::shared_ptr<gloo::Context>& c, auto t) {
          gloo::ReduceOptions o(c);
          o.setOutput(data, count);
          o.setRoot(root);
          o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
          o.setTimeout(t);
          gloo::reduce(o);
        });
  }
  void broadcast_bytes(const ProcessGroup& pg, void* data, std::size_t bytes, int root) override {
    run(pg, root == 0 ? "a broadcast from process 0 (Gloo)" : "a broadcast (Gloo)",
        [&](const std::shared_ptr<gloo::Context>& c, auto t) {
          gloo::BroadcastOptions o(c);
          o.setOutput(static_cast<char*>(data), bytes);
          o.setRoot(root);
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
  // Every rank's ints, rank after rank, before a group exists (the levels' check while joining).
  std::vector<int> allgather_ints(int rank, int size, double timeout_s, std::vector<int> mine) {
    std::vector<int> all(mine.size() * static_cast<std::size_t>(size));
    run("an all-gather while joining (Gloo)", rank, size, timeout_s,
        [&](const std::shared_ptr<gloo::Context>& c, auto t) {
          gloo::AllgatherOptions o(c);
          o.setInput(mine.data(), mine.size());
          o.setOutput(all.data(), all.size());
          o.setTimeout(t);
          gloo::allgather(o);
        });
    return all;
  }
  void barrier(int rank, int size, double timeout_s) {
    run("a barrier (Gloo)", rank, size, timeout_s, [&](const std::shared_ptr<gloo::Context>& c, auto t) {
      gloo::BarrierOptions o(c);
      o.setTimeout(t);
      gloo::barrier(o);
    });
  }
  Silence silent_peers(const ProcessGroup&, double window_s) override {
    state_->fail();  // it asks because a call failed here
    return live_->ask(window_s);
  }
  void waiting(int delta) override { delta > 0 ? state_->enter() : state_->leave(); }

  // Point to point on p2p_, a mesh of its own (its users: a server's threads, which receive forever,
  // and a worker's), never the collectives' context. A wait ends at its deadline without closing the
  // mesh's other pairs (the server threads' own), and only the pair with the peer waited for closes.
  void set_p2p(std::shared_ptr<gloo::rendezvous::Context> p2p) { p2p_ = std::move(p2p); }
  void send(const ProcessGroup& pg, int to, const void* data, std::size_t bytes, std::uint64_t slot) override {
    if (!p2p_) return Transport::send(pg, to, data, bytes, slot);
    const Call in(*state_);
    p2p_call(pg, {to}, "a message to", [&] {
      auto b = p2p_->createUnboundBuffer(const_cast<void*>(data), bytes);
      b->send(to, slot);
      return gloo_live::wait_send(deadlines_, *b, pg.sync_timeout());
    });
  }
  int recv(const ProcessGroup& pg, const std::vector<int>& from, void* data, std::size_t bytes, std::uint64_t slot,
           bool forever) override {
    if (!p2p_) return Transport::recv(pg, from, data, bytes, slot, forever);
    const Call in(*state_, !forever);  // a server waiting for work is not waiting on the group
    int who = -1;
    p2p_call(pg, from, "a message from", [&] {
      auto b = p2p_->createUnboundBuffer(data, bytes);
      {
        std::lock_guard<std::mutex> l(p2p_mu_);
        b->recv(from, slot);
        if (forever) pending_.push_back(b.get());  // only receives that wait forever are cancelled
      }
      bool got = false;
      try {
        got = gloo_live::wait_recv(deadlines_, *b, forever ? 0 : pg.sync_timeout(), &who);
      } catch (...) {
        std::lock_guard<std::mutex> l(p2p_mu_);
        std::erase(pending_, b.get());
        throw;
      }
      std::lock_guard<std::mutex> l(p2p_mu_);
      std::erase(pending_, b.get());
      if (!got) who = -1;
      return got || forever;  // a receive waiting forever that returns was cancelled
    });
    return who;
  }
  bool cancel_recv() override {
    std::lock_guard<std::mutex> l(p2p_mu_);
    for (auto* b : pending_) b->abortWaitRecv();
    return !pending_.empty();
  }

 private:
  // Inside a call (or not counted: a receive that waits for work) for as long as it lives.
  struct Call {
    explicit Call(gloo_live::CallState& s, bool counted = true) : s_(counted ? &s : nullptr) {
      if (s_) s_->enter();
    }
    ~Call() {
      if (s_) s_->leave();
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    gloo_live::CallState* s_;
  };
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
    const std::string w = pg.level_name().empty() ? std::string(what) : fmt::format("{} {}", what, pg.level_name());
    run(w.c_str(), pg.world_rank(), pg.world_size(), pg.sync_timeout(), std::forward<F>(f), &pg);
  }
  // One collective at a time (the communication thread and the main thread share the group), its
  // failures as SyncError saying whether it timed out or a peer went away, and who.
  template <class F>
  void run(const char* what, int rank, int size, double limit, F&& f, const ProcessGroup* pg = nullptr) {
    const Call in(*state_);
    std::unique_lock<std::mutex> l(mu_);
    std::shared_ptr<gloo::rendezvous::Context> c;
    {
      std::lock_guard<std::mutex> p(ptr_mu_);
      c = ctx_;
    }
    if (!c) throw SyncError(fmt::format("{}: the group was ended after an earlier failure", what));
    std::string why;
    try {
      f(std::static_pointer_cast<gloo::Context>(c), gloo_live::as_timeout(limit));
      return;
    } catch (const gloo::Exception& e) {
      why = e.what();
    } catch (const gloo::EnforceNotMet& e) {  // Gloo's own checks (a pair not connected) are not gloo::Exception
      why = e.what();
    }
    state_->fail();
    {
      std::lock_guard<std::mutex> p(ptr_mu_);
      if (ctx_ == c) ctx_.reset();  // a failed collective leaves its pairs in no known state
    }
    c.reset();
    l.unlock();  // the asks take up to seconds: abort() and the other thread need not wait for them
    // who: the well ranks answer that they are in the call or failed in it too; a rank that is in
    // its own work, stopped or gone is named (a timeout here closes this process's pairs, so a well
    // peer may see a dropped connection and still name the stalled rank rightly)
    const double window = std::clamp(limit / 4, 2.0, 10.0);
    const ProcessGroup none;  // joining: no group yet, ranks named by number
    const std::string who = say_silence(pg ? *pg : none, live_->ask(window), window, stalled_after(limit, window));
    if (why.find("Timed out") != std::string::npos)
      throw SyncError(fmt::format(
          "{} did not complete within {:g} s on process {} of {}: {}. If the step is legitimately that slow, raise "
          "--sync-timeout-s (0 waits forever)",
          what, limit, rank, size, who.empty() ? "another process failed or stalled" : who));
    throw SyncError(fmt::format("{} failed on process {} of {}: {} ({})", what, rank, size,
                                who.empty() ? "another process ended or dropped its connection" : who, why));
  }
  // A message's failure, or its deadline (f returns false), as SyncError naming the peer after asking
  // it: one that does not answer stalled or ended; one that does is running but did not keep up (or
  // closed the connection: its own message says why). The peer's pair closes, so that nothing posted
  // here lands late.
  template <class F>
  void p2p_call(const ProcessGroup& pg, const std::vector<int>& peers, const char* what, F&& f) {
    std::string why;
    try {
      if (f()) return;
    } catch (const gloo::EnforceNotMet& e) {  // Gloo's own checks are not gloo::Exception
      why = e.what();
    } catch (const gloo::Exception& e) {
      why = e.what();
    }
    state_->fail();
    for (int r : peers) gloo_live::break_pair(*p2p_, r);
    const double limit = pg.sync_timeout(), window = std::clamp(limit / 4, 2.0, 10.0);
    std::string said = say_silence(pg, live_->ask(window, peers), window, stalled_after(limit, window));
    if (said.empty())  // every peer asked is there, in a call of its own or briefly between two
      said = fmt::format(
          "{} answered within {:g} s: it is running but {}", pg.name_ranks(peers), window,
          why.empty() ? "did not keep up (a stalled thread?)" : "closed the connection (its own message says why)");
    const std::string whom = peers.size() == 1 ? pg.name_ranks(peers) : "another process";
    if (why.empty())
      throw SyncError(fmt::format(
          "{} {} did not complete within {:g} s on process {} of {}: {}. If that is legitimately slow, raise "
          "--sync-timeout-s (0 waits forever)",
          what, whom, limit, pg.world_rank(), pg.world_size(), said));
    throw SyncError(fmt::format("{} {} failed on process {} of {}: {} ({})", what, whom, pg.world_rank(),
                                pg.world_size(), said, why));
  }
  std::shared_ptr<gloo_live::CallState> state_;  // before live_, which reads it
  std::shared_ptr<gloo::rendezvous::Context> ctx_, p2p_;
  std::unique_ptr<gloo_live::Liveness> live_;
  gloo_live::Deadlines deadlines_;
  std::mutex mu_, ptr_mu_, p2p_mu_;                       // mu_: one collective at a time; ptr_mu_: ctx_ itself
  std::vector<gloo::transport::UnboundBuffer*> pending_;  // receives waiting forever, for cancel_recv
};

std::string host_name() {
  char h[256] = {};
  gethostname(h, sizeof h - 1);
  return h;
}

// The address Gloo listens on: loopback when every process is on this host (by the launcher's
// variables and by the hosts they met from); else the local address that routes to the store's host
// (a connected UDP socket sends nothing); else the host name.
std::string gloo_address(const LaunchEnv& env, bool one_host) {
  if (env.local_size == env.size && one_host) return "127.0.0.1";
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

Joined join_gloo(const LaunchEnv& env, double timeout_s, bool point_to_point) {
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
  // across hosts each host is a node (comm/transport.hpp), whatever the launcher's variables said
  LaunchEnv placed = env;
  const bool one_host = !place_by_host(j.peers, placed);
  j.local_rank = placed.local_rank;
  j.local_size = placed.local_size;
  gloo::transport::tcp::attr attr;
  attr.hostname = gloo_address(env, one_host);
  std::shared_ptr<gloo::transport::Device> dev;
  try {
    dev = gloo::transport::tcp::CreateDevice(attr);
  } catch (const gloo::Exception& e) {
    throw UsageError(
        fmt::format("Gloo cannot listen on {} ({}): check that this host's name resolves to an "
                    "address the other processes reach",
                    attr.hostname, e.what()));
  }
  // Gloo waits up to 5 x its timeout for a pair to connect: a fifth while connecting, so that a
  // stalled peer ends the meeting within the timeout
  const auto mesh = [&](const std::string& prefix, int rank, int size) {
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(timeout_s > 0 ? gloo_live::as_timeout(std::max(timeout_s / 5, 1.0)) : gloo_live::as_timeout(0));
    GlooStore gs(*store, timeout_s, prefix);
    try {
      ctx->connectFullMesh(gs, dev);
    } catch (const gloo::Exception& e) {
      throw SyncError(fmt::format("Gloo could not connect rank {} to the others ({})", env.rank, e.what()));
    } catch (const gloo::EnforceNotMet& e) {
      throw SyncError(fmt::format("Gloo could not connect rank {} to the others ({})", env.rank, e.what()));
    }
    ctx->setTimeout(gloo_live::as_timeout(timeout_s));
    return ctx;
  };
  auto ctx = mesh("gloo/", env.rank, env.size);
  auto live = mesh("gloo-live/", env.rank, env.size);
  const auto state = std::make_shared<gloo_live::CallState>();
  auto t = std::make_unique<GlooTransport>(ctx, live, state);
  if (point_to_point) t->set_p2p(mesh("gloo-p2p/", env.rank, env.size));
  j.node = placed.node;
  j.nodes = placed.nodes;
  // the two levels, each its own pair of meshes, where several nodes have several processes each
  const LaunchEnv& e = placed;
  const std::vector<int> pairs = t->allgather_ints(e.rank, e.size, timeout_s, {e.node, e.local_rank});
  auto [within, across] = level_members(pairs, e.node, e.local_rank, e.nodes, e.local_size, j.levels_why);
  if (!within.empty() && e.local_size > 1 && e.nodes > 1) {
    const std::string in = fmt::format("gloo-node{}", e.node), out = fmt::format("gloo-across{}", e.local_rank);
    j.within = std::make_unique<GlooTransport>(mesh(in + "/", e.local_rank, e.local_size),
                                               mesh(in + "-live/", e.local_rank, e.local_size), state);
    j.across =
        std::make_unique<GlooTransport>(mesh(out + "/", e.node, e.nodes), mesh(out + "-live/", e.node, e.nodes), state);
    j.within_ranks = std::move(within);
    j.across_ranks = std::move(across);
  }
  t->barrier(env.rank, env.size, timeout_s);  // every rank is connected: the store has served its purpose
  if (env.rank == 0) store->clear();
  j.transport = std::move(t);
  return j;
}

}  // namespace stepbench
