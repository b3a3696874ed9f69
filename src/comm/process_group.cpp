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

std::unique_ptr<ProcessGroup> ProcessGroup::create(const LaunchEnv& env, double timeout_s) {
  auto pg = std::make_unique<ProcessGroup>();
  pg->set_sync_timeout(timeout_s);
  if (!env.multi()) return pg;
  Joined j = env.rendezvous == "mpi" ? join_mpi(timeout_s) : join_gloo(env, timeout_s);
  pg->rank_ = j.rank;
  pg->size_ = j.size;
  pg->local_rank_ = j.local_rank;
  pg->local_size_ = j.local_size;
  pg->node_ = env.node;
  pg->nodes_ = env.nodes;
  pg->threads_ok_ = j.threads_ok;
  pg->mpi_ = env.rendezvous == "mpi";
  pg->launcher_ = std::string(to_string(env.launcher));
  pg->t_ = std::move(j.transport);
  pg->peers_ = std::move(j.peers);
  SB_CHECK(pg->peers_.size() == static_cast<std::size_t>(pg->size_), "the transport names every rank");
  return pg;
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::transport_name() const { return t_ ? t_->name() : ""; }

void ProcessGroup::abort(int code) const {
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

void ProcessGroup::reduce_sum_to_root(float* data, std::size_t count) const {
  if (t_ && size_ > 1) t_->reduce_sum_to_root(*this, data, count);
}

void ProcessGroup::broadcast_from_root(float* data, std::size_t count) const {
  broadcast_bytes_from_root(data, count * sizeof(float));
}

void ProcessGroup::broadcast_bytes_from_root(void* data, std::size_t bytes) const {
  if (t_ && size_ > 1) t_->broadcast_bytes(*this, data, bytes);
}

std::string ProcessGroup::silent_ranks(double window_s) const {
  if (!t_ || size_ == 1) return "";
  std::vector<int> silent;
  try {
    silent = t_->silent_peers(*this, window_s);
  } catch (const std::exception&) {
    return "";
  }
  return name_ranks(silent);
}

std::string ProcessGroup::name_ranks(const std::vector<int>& ranks) const {
  std::string s;
  for (int r : ranks) {
    s += (s.empty() ? "" : ", ") + std::to_string(r);
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
