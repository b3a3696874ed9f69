// What the Gloo transport (comm/gloo_group.cpp) needs to wait without Gloo's own timeouts and to ask
// who is alive at any time. Gloo ends a wait that times out by closing every pair of its context,
// which would fail the other threads' messages on it too (a server's, in distributed_replicated);
// here a wait is ended by a deadline thread instead (abortWaitRecv/abortWaitSend), and a peer's
// connection is closed alone when it must be. Internal to src/comm, built with STEPBENCH_GLOO.
#pragma once
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/transport.hpp"

namespace stepbench::gloo_live {

using Clock = std::chrono::steady_clock;

// Gloo's timeout for a wait of `s` seconds; 0 waits forever (ten years is Gloo's forever).
std::chrono::milliseconds as_timeout(double s);

// A thread that ends waits at their deadlines: add() registers a buffer's receive (or send) wait,
// cancel() takes it back. After cancel returns, that buffer's abort will not be called.
class Deadlines {
 public:
  ~Deadlines();
  std::uint64_t add(gloo::transport::UnboundBuffer* b, bool recv, Clock::time_point until);
  void cancel(std::uint64_t ticket);

 private:
  struct Entry {
    gloo::transport::UnboundBuffer* b;
    bool recv;
    Clock::time_point until;
  };
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, Entry> due_;
  std::uint64_t next_ = 0;
  bool stop_ = false;
  std::thread th_;  // started by the first add
};

// b's posted receive (or send), waited for up to limit_s seconds (0: forever) without closing any
// pair: true when it completed, false when the deadline ended it. Its operation is then still
// posted: keep the buffer until the pair is closed (break_pair), or close the pair before it goes
// (Gloo's NonOwningPtr makes its destructor wait for the pair's use of it). Gloo's exceptions (a
// closed pair) pass through.
bool wait_recv(Deadlines& d, gloo::transport::UnboundBuffer& b, double limit_s, int* who = nullptr);
bool wait_send(Deadlines& d, gloo::transport::UnboundBuffer& b, double limit_s);

// Closes the pair with `rank` (the peer sees its connection drop; nothing still posted on it here
// is written to afterwards); the context's other pairs are untouched.
void break_pair(gloo::Context& c, int rank);
void break_all(gloo::Context& c);

// What this process is doing with its groups, as a liveness answer says it: inside one of their calls
// (a collective, a message, a GPU collective polled: ProcessGroup::Waiting), ended after a failure,
// or outside every call since a time. One per process, shared by its world and level transports, so
// that a rank waiting in a call of one level is not taken as idle by another's ask.
class CallState {
 public:
  void enter();
  void leave();
  void fail() { failed_ = true; }
  // <0: in a call or failed; else the seconds since the last call ended (or the transport began)
  double idle_s() const;

 private:
  std::atomic<int> calls_{0};
  std::atomic<bool> failed_{false};
  std::atomic<Clock::rep> idle_since_{Clock::now().time_since_epoch().count()};
};

// A mesh of its own for liveness: a thread per peer answers each of its asks with the CallState (one
// receive from any peer would, once a peer that asked went, pick that peer's queued ask first and
// fail every time after), and ask() sends every peer given an ask and waits up to window_s for the
// answers. Answers that come late go to buffers kept until the mesh goes, so that no late message
// lands in freed memory.
class Liveness {
 public:
  Liveness(std::shared_ptr<gloo::Context> mesh, const CallState& state);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;
  // peers empty: every other rank
  Silence ask(double window_s, std::vector<int> peers = {});

 private:
  struct Ping {
    std::uint64_t seq = 0;
  };
  struct Pong {
    std::uint64_t seq = 0;
    double idle_s = 0;
  };
  struct Kept;  // an ask's or an answer's buffers
  void answer(int from);
  std::shared_ptr<gloo::Context> mesh_;
  const CallState& state_;
  Deadlines deadlines_;
  std::mutex ask_mu_;  // one ask at a time
  std::mutex mu_;      // kept_, current_, stop_ (held briefly: the answering threads take it too)
  std::vector<std::unique_ptr<Kept>> kept_;
  std::vector<gloo::transport::UnboundBuffer*> current_;  // each answering thread's posted receive
  std::uint64_t seq_ = 0;
  bool stop_ = false;
  std::vector<std::thread> th_;  // last: they use the members above
};

}  // namespace stepbench::gloo_live
