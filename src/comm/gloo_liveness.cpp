// Waits that end at a deadline without closing Gloo's pairs, a peer's connection closed alone, and
// the liveness mesh that answers every ask (comm/gloo_liveness.hpp).
#include "comm/gloo_liveness.hpp"

#include <gloo/common/error.h>
#include <gloo/transport/pair.h>

#include <algorithm>

namespace stepbench::gloo_live {

std::chrono::milliseconds as_timeout(double s) {
  return s > 0 ? std::chrono::milliseconds(static_cast<std::int64_t>(s * 1e3) + 1) : std::chrono::hours(24 * 3650);
}

Deadlines::~Deadlines() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (th_.joinable()) th_.join();
}

std::uint64_t Deadlines::add(gloo::transport::UnboundBuffer* b, bool recv, Clock::time_point until) {
  std::lock_guard<std::mutex> l(mu_);
  if (!th_.joinable()) th_ = std::thread([this] { loop(); });
  const std::uint64_t t = next_++;
  due_[t] = {b, recv, until};
  cv_.notify_all();
  return t;
}

void Deadlines::cancel(std::uint64_t ticket) {
  std::lock_guard<std::mutex> l(mu_);
  due_.erase(ticket);
}

void Deadlines::loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    if (due_.empty()) {
      cv_.wait(l);
      continue;
    }
    const auto first = std::min_element(due_.begin(), due_.end(),
                                        [](const auto& a, const auto& b) { return a.second.until < b.second.until; });
    if (const Clock::time_point until = first->second.until; Clock::now() < until) {
      cv_.wait_until(l, until);  // a copy: cancel() may erase the entry while this waits
      continue;
    }
    // under the lock: cancel() waits for it, so the buffer is still there
    if (first->second.recv)
      first->second.b->abortWaitRecv();
    else
      first->second.b->abortWaitSend();
    due_.erase(first);
  }
}

namespace {
template <class Wait>
bool wait_by(Deadlines& d, gloo::transport::UnboundBuffer& b, bool recv, double limit_s, Wait&& wait) {
  if (limit_s <= 0) return wait();
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
  const std::uint64_t t = d.add(&b, recv, until);
  bool done = false;
  try {
    done = wait();
  } catch (...) {
    d.cancel(t);
    throw;
  }
  d.cancel(t);
  return done;
}
}  // namespace

bool wait_recv(Deadlines& d, gloo::transport::UnboundBuffer& b, double limit_s, int* who) {
  return wait_by(d, b, true, limit_s, [&] { return b.waitRecv(who, as_timeout(0)); });
}

bool wait_send(Deadlines& d, gloo::transport::UnboundBuffer& b, double limit_s) {
  return wait_by(d, b, false, limit_s, [&] { return b.waitSend(nullptr, as_timeout(0)); });
}

// Gloo's tcp pair closes its socket (the peer's reads fail at once) and stops reading it, so nothing
// lands in a buffer still posted on it; this process's own waits on it are not woken (Debian's
// libgloo-dev lacks the header that tcp::Pair::signalExceptionExternal needs): each ends at its deadline.
void break_pair(gloo::Context& c, int rank) {
  if (rank < 0 || rank >= c.size || rank == c.rank) return;
  auto& p = c.getPair(rank);
  if (p) p->close();
}

void break_all(gloo::Context& c) {
  for (int r = 0; r < c.size; ++r) break_pair(c, r);
}

void CallState::enter() { ++calls_; }

void CallState::leave() {
  // the time first: an answer read between the two must not see the idle time since an older call
  idle_since_ = Clock::now().time_since_epoch().count();
  --calls_;
}

double CallState::idle_s() const {
  if (failed_ || calls_ > 0) return -1;
  const Clock::time_point since{Clock::duration(idle_since_.load())};
  return std::chrono::duration<double>(Clock::now() - since).count();
}

namespace {
constexpr std::uint64_t kAsk = 0x535445504c495645ull;  // "STEPLIVE"; an answer to ask k comes on kAsk + 1 + k
}

struct Liveness::Kept {
  Ping ping;
  Pong pong;
  std::unique_ptr<gloo::transport::UnboundBuffer> rx, tx;
  bool gone = false;
};

Liveness::Liveness(std::shared_ptr<gloo::Context> mesh, const CallState& state)
    : mesh_(std::move(mesh)), state_(state), current_(static_cast<std::size_t>(mesh_->size), nullptr) {
  for (int r = 0; r < mesh_->size; ++r)
    if (r != mesh_->rank) th_.emplace_back([this, r] { answer(r); });
}

Liveness::~Liveness() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    for (auto* b : current_)
      if (b) b->abortWaitRecv();
  }
  for (auto& t : th_) t.join();
  break_all(*mesh_);  // nothing pending may outlive its buffer
}

// The thread answering peer `from`: a receive from it, answered with this process's state on the slot
// the ask names, even while the mesh is going (the asker waits for it). The sends are not waited for
// (a peer that asked and went must not stop the answers); their buffers are kept. It ends when the
// peer's connection goes, or with the mesh.
void Liveness::answer(int from) {
  const auto at = static_cast<std::size_t>(from);
  for (;;) {
    Kept* k = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      kept_.push_back(std::make_unique<Kept>());
      k = kept_.back().get();
      try {
        k->rx = mesh_->createUnboundBuffer(&k->ping, sizeof k->ping);
        k->rx->recv(from, kAsk);
        current_[at] = k->rx.get();
      } catch (const std::exception&) {
        return;  // its connection is gone: it asks nothing more
      }
    }
    bool got = false;
    try {
      got = k->rx->waitRecv(nullptr, as_timeout(0));
    } catch (const std::exception&) {  // its connection went
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      current_[at] = nullptr;
    }
    if (!got) return;  // gone, or the mesh is going (the wait was aborted)
    k->pong = {k->ping.seq, state_.idle_s()};
    try {
      k->tx = mesh_->createUnboundBuffer(&k->pong, sizeof k->pong);
      k->tx->send(from, kAsk + 1 + k->ping.seq);
    } catch (const std::exception&) {  // gone since it asked
      return;
    }
  }
}

Silence Liveness::ask(double window_s, std::vector<int> peers) {
  std::lock_guard<std::mutex> one(ask_mu_);
  if (peers.empty())
    for (int r = 0; r < mesh_->size; ++r) peers.push_back(r);
  std::erase(peers, mesh_->rank);
  const std::uint64_t seq = ++seq_;
  std::vector<Kept*> asked;
  for (int r : peers) {
    Kept* k = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      kept_.push_back(std::make_unique<Kept>());
      k = kept_.back().get();
    }
    k->ping.seq = seq;
    try {
      k->rx = mesh_->createUnboundBuffer(&k->pong, sizeof k->pong);
      k->rx->recv(r, kAsk + 1 + seq);
      k->tx = mesh_->createUnboundBuffer(&k->ping, sizeof k->ping);
      k->tx->send(r, kAsk);
    } catch (const std::exception&) {  // its connection is gone
      k->gone = true;
    }
    asked.push_back(k);
  }
  const auto until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(window_s));
  Silence s;
  for (std::size_t i = 0; i < peers.size(); ++i) {
    Kept& k = *asked[i];
    if (!k.gone) {
      // an answer that came is counted whatever happened since; one still missing at the deadline is not
      const double left = std::chrono::duration<double>(until - Clock::now()).count();
      try {
        // at least 0.1 s: a deadline that fires before the wait takes the buffer would count an answer
        // that had come as missing (Gloo's wait looks at the abort first)
        k.gone = !wait_recv(deadlines_, *k.rx, std::max(left, 0.1));
      } catch (const std::exception&) {
        k.gone = true;
      }
    }
    if (k.gone)
      s.gone.push_back(peers[i]);
    else if (k.pong.idle_s >= 0)
      s.idle.emplace_back(peers[i], k.pong.idle_s);
  }
  return s;
}

}  // namespace stepbench::gloo_live
