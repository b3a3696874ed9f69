// The process group: rank 0 of 1 outside a launcher; under one, what its transport (MPI or Gloo,
// comm/transport.hpp) says. Every collective is an identity for a single process.
#include "comm/process_group.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "comm/launch_env.hpp"
#include "comm/transport.hpp"
#include "tensor/error.hpp"

namespace stepbench {

ProcessGroup::ProcessGroup() : peers_(1) {}

std::unique_ptr<ProcessGroup> ProcessGroup::create(const LaunchEnv& env, double timeout_s, bool point_to_point) {
  auto pg = std::make_unique<ProcessGroup>();
  pg->set_sync_timeout(timeout_s);
  if (!env.multi()) return pg;
  Joined j = env.rendezvous == "mpi" ? join_mpi(env, timeout_s) : join_gloo(env, timeout_s, point_to_point);
  pg->rank_ = j.rank;
  pg->size_ = j.size;
  pg->local_rank_ = j.local_rank;
  pg->local_size_ = j.local_size;
  pg->node_ = j.node;
  pg->nodes_ = j.nodes;
  pg->threads_ok_ = j.threads_ok;
  pg->mpi_ = env.rendezvous == "mpi";
  pg->launcher_ = std::string(to_string(env.launcher));
  pg->t_ = std::move(j.transport);
  pg->peers_ = std::move(j.peers);
  SB_CHECK(pg->peers_.size() == static_cast<std::size_t>(pg->size_), "the transport names every rank");
  pg->levels_why_ = j.levels_why;
  if (!j.within_ranks.empty()) {
    pg->within_ = level(*pg, std::move(j.within), j.within_ranks, fmt::format("within node {}", pg->node_));
    pg->across_ = level(*pg, std::move(j.across), j.across_ranks, "across the nodes");
  }
  pg->alone_ = std::make_unique<ProcessGroup>();
  pg->alone_->world_ = {pg->rank_};
  pg->alone_->world_size_ = pg->size_;
  pg->alone_->peers_ = {pg->peers_[static_cast<std::size_t>(pg->rank_)]};
  return pg;
}

std::unique_ptr<ProcessGroup> ProcessGroup::level(const ProcessGroup& whole, std::unique_ptr<Transport> t,
                                                  const std::vector<int>& members, std::string name) {
  auto l = std::make_unique<ProcessGroup>();
  l->level_name_ = std::move(name);
  l->size_ = static_cast<int>(members.size());
  l->rank_ = static_cast<int>(std::find(members.begin(), members.end(), whole.rank_) - members.begin());
  SB_CHECK(l->rank_ < l->size_, "a level holds its process");
  l->local_rank_ = l->rank_;
  l->local_size_ = l->size_;
  l->threads_ok_ = whole.threads_ok_;
  l->mpi_ = whole.mpi_;
  l->launcher_ = whole.launcher_;
  l->world_ = members;
  l->world_size_ = whole.size_;
  l->peers_.clear();
  for (int r : members) l->peers_.push_back(whole.peers_[static_cast<std::size_t>(r)]);
  l->timeout_s_ = whole.timeout_s_.load();
  l->t_ = std::move(t);  // null for a level of one
  return l;
}

// Without levels of their own: one node is the whole group within it and this process alone across;
// one process per node (or no levels) this process alone within and the whole group across.
const ProcessGroup& ProcessGroup::within_node() const {
  if (within_) return *within_;
  if (nodes_ == 1 && levels_why_.empty()) return *this;
  return alone_ ? *alone_ : *this;
}

const ProcessGroup& ProcessGroup::across_nodes() const {
  if (across_) return *across_;
  if (nodes_ == 1 && levels_why_.empty() && alone_) return *alone_;
  return *this;
}

void ProcessGroup::set_sync_timeout(double seconds) {
  timeout_s_ = seconds;
  for (ProcessGroup* l : {within_.get(), across_.get()})
    if (l) l->set_sync_timeout(seconds);
}

std::pair<std::vector<int>, std::vector<int>> level_members(const std::vector<int>& pairs, int node, int local_rank,
                                                            int nodes, int local_size, std::string& why) {
  const std::size_t n = pairs.size() / 2;
  const auto at = [local_size](int nd, int lr) {
    return static_cast<std::size_t>(nd) * static_cast<std::size_t>(local_size) + static_cast<std::size_t>(lr);
  };
  std::vector<int> where(at(nodes, 0), -1);  // (node, local) -> rank
  for (std::size_t r = 0; r < n; ++r) {
    const int nd = pairs[2 * r], lr = pairs[2 * r + 1];
    if (nd < 0 || nd >= nodes || lr < 0 || lr >= local_size) {
      why = fmt::format("rank {} is local rank {} of node {}, outside {} nodes of {} processes", r, lr, nd, nodes,
                        local_size);
      return {};
    }
    int& slot = where[at(nd, lr)];
    if (slot >= 0) {
      why = fmt::format("ranks {} and {} are both local rank {} of node {}", slot, r, lr, nd);
      return {};
    }
    slot = static_cast<int>(r);
  }
  if (n != where.size()) {
    why = fmt::format("{} processes do not fill {} nodes of {}", n, nodes, local_size);
    return {};
  }
  std::vector<int> within, across;
  for (int l = 0; l < local_size; ++l) within.push_back(where[at(node, l)]);
  for (int d = 0; d < nodes; ++d) across.push_back(where[at(d, local_rank)]);
  return {within, across};
}

bool place_by_host(const std::vector<PeerInfo>& peers, LaunchEnv& env) {
  std::vector<std::string> hosts;  // in the order of their first rank
  for (const auto& p : peers)
    if (std::find(hosts.begin(), hosts.end(), p.host) == hosts.end()) hosts.push_back(p.host);
  if (hosts.size() < 2) return false;
  if (env.nodes_given) return true;
  const std::string& mine = peers[static_cast<std::size_t>(env.rank)].host;
  env.node = static_cast<int>(std::find(hosts.begin(), hosts.end(), mine) - hosts.begin());
  env.nodes = static_cast<int>(hosts.size());
  env.local_rank = env.local_size = 0;
  for (std::size_t r = 0; r < peers.size(); ++r)
    if (peers[r].host == mine) {
      if (static_cast<int>(r) < env.rank) ++env.local_rank;
      ++env.local_size;
    }
  return true;
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::transport_name() const { return t_ ? t_->name() : ""; }

void ProcessGroup::abort(int code) const {
  for (const ProcessGroup* l : {within_.get(), across_.get()})  // peers waiting in a level fail at once too
    if (l && !mpi_) l->abort(code);
  if (t_ && size_ > 1) t_->abort(code);
}

double ProcessGroup::allreduce_max(double v) const {
  if (t_ && size_ > 1) t_->allreduce_max(*this, &v, 1);
  return v;
}

void ProcessGroup::allreduce_max(std::vector<double>& v) const {
  if (t_ && size_ > 1 && !v.empty()) t_->allreduce_max(*this, v.data(), v.size());
}

void ProcessGroup::allreduce_sum(float* data, std::size_t count) const {
  if (t_ && size_ > 1) t_->allreduce_sum(*this, data, count);
}

void ProcessGroup::reduce_sum_to(float* data, std::size_t count, int root) const {
  if (t_ && size_ > 1) t_->reduce_sum_to(*this, data, count, root);
}

void ProcessGroup::broadcast_from(float* data, std::size_t count, int root) const {
  if (t_ && size_ > 1) t_->broadcast_bytes(*this, data, count * sizeof(float), root);
}

void ProcessGroup::broadcast_bytes_from_root(void* data, std::size_t bytes) const {
  if (t_ && size_ > 1) t_->broadcast_bytes(*this, data, bytes, 0);
}

std::string ProcessGroup::silent_ranks(double window_s, double stalled_s) const {
  if (!t_ || size_ == 1) return "";
  try {
    return say_silence(*this, t_->silent_peers(*this, window_s), window_s, stalled_s);
  } catch (const std::exception&) {
    return "";
  }
}

ProcessGroup::Waiting::Waiting(Transport* t) : t_(t) {
  if (t_) t_->waiting(+1);
}

ProcessGroup::Waiting::~Waiting() {
  if (t_) t_->waiting(-1);
}

std::string say_silence(const ProcessGroup& pg, const Silence& s, double window_s, double stalled_s) {
  std::string out;
  if (!s.gone.empty())
    out = fmt::format("{} did not answer within {:g} s (stalled or ended)", pg.name_ranks(s.gone), window_s);
  std::vector<int> who;
  double least = 0;
  for (const auto& [r, idle] : s.idle)
    if (idle >= stalled_s) {
      least = who.empty() ? idle : std::min(least, idle);
      who.push_back(r);
    }
  if (!who.empty()) {
    const bool one = who.size() == 1;
    out += fmt::format(
        "{}{} answered from outside the group's calls, where {} had been for {:.1f} s{} (stalled in {} "
        "own work)",
        out.empty() ? "" : "; ", pg.name_ranks(who), one ? "it" : "they", least, one ? "" : " or more",
        one ? "its" : "their");
  }
  return out;
}

void Transport::send(const ProcessGroup&, int, const void*, std::size_t, std::uint64_t) {
  throw UsageError(
      fmt::format("{} carries no point-to-point messages between stepbench's processes: "
                  "--cross-replica-sync off needs the processes to meet through Gloo (stepbench launch, "
                  "torchrun, srun), whose server answers on a thread of its own",
                  name()));
}

int Transport::recv(const ProcessGroup& pg, const std::vector<int>&, void*, std::size_t, std::uint64_t, bool) {
  send(pg, 0, nullptr, 0, 0);  // the same refusal
  return -1;
}

void ProcessGroup::send(int to, const void* data, std::size_t bytes, std::uint64_t slot) const {
  if (!t_) throw UsageError("point-to-point messages need several processes");
  t_->send(*this, to, data, bytes, slot);
}

int ProcessGroup::recv(const std::vector<int>& from, void* data, std::size_t bytes, std::uint64_t slot,
                       bool forever) const {
  if (!t_) throw UsageError("point-to-point messages need several processes");
  return t_->recv(*this, from, data, bytes, slot, forever);
}

bool ProcessGroup::cancel_recv() const { return t_ && t_->cancel_recv(); }

std::string ProcessGroup::name_ranks(const std::vector<int>& ranks) const {
  std::string s;
  for (int r : ranks) {
    const bool in_level = r >= 0 && static_cast<std::size_t>(r) < world_.size();
    s += (s.empty() ? "" : ", ") + std::to_string(in_level ? world_[static_cast<std::size_t>(r)] : r);
    if (r >= 0 && static_cast<std::size_t>(r) < peers_.size() && peers_[static_cast<std::size_t>(r)].pid > 0) {
      const PeerInfo& p = peers_[static_cast<std::size_t>(r)];
      s += fmt::format(" (pid {}{})", p.pid, p.host.empty() ? "" : " on " + p.host);
    }
  }
  return s.empty() ? "" : fmt::format("rank{} {}", ranks.size() > 1 ? "s" : "", s);
}

std::vector<double> ProcessGroup::allgather(const std::vector<double>& mine) const {
  if (!t_ || size_ == 1) return mine;
  std::vector<double> all(mine.size() * static_cast<std::size_t>(size_));
  if (!mine.empty()) t_->allgather_bytes(*this, mine.data(), mine.size() * sizeof(double), all.data());
  return all;
}

std::vector<std::string> ProcessGroup::allgather(const std::string& mine) const {
  if (!t_ || size_ == 1) return {mine};
  const std::vector<double> lengths = allgather(std::vector<double>{static_cast<double>(mine.size())});
  const std::size_t longest = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::vector<std::string> out(static_cast<std::size_t>(size_));
  if (longest == 0) return out;
  std::string padded = mine;
  padded.resize(longest, '\0');
  std::string all(longest * static_cast<std::size_t>(size_), '\0');
  t_->allgather_bytes(*this, padded.data(), longest, all.data());
  for (std::size_t r = 0; r < out.size(); ++r) out[r] = all.substr(r * longest, static_cast<std::size_t>(lengths[r]));
  return out;
}

}  // namespace stepbench
