// distributed_replicated (tf_cnn_benchmarks' mode, as the high-performance-models guide describes it):
// every tower holds a copy of the variables; the towers of a node sum their gradients first (in host
// memory, then onto the node's first process); each node's sum is pushed to the parameter servers,
// which hold the master copy sharded over them (--ps-ranks K: server s is the first process of node
// s * nodes / K and owns the s-th contiguous K-th of the variables) and apply the update to it; every
// process then pulls the new values (from the servers to each node's first process, then within the
// node). The servers also compute, as a parameter-server task placed beside a worker does. CPU towers.
#include <fmt/format.h>

#include <algorithm>

#include "tensor/error.hpp"
#include "train/sync.hpp"

namespace stepbench {
namespace {

TensorDesc flat_of(std::size_t count) {
  return TensorDesc::dense(Shape{1, static_cast<std::int64_t>(count), 1, 1}, DType::f32, Layout::nchw);
}

class DistributedReplicatedSync final : public GradientSync {
 public:
  DistributedReplicatedSync(const SyncTowers& t, const OptimizerConfig& optimizer, int ps_ranks)
      : t_(t), in_(t.group.within_node()), across_(t.group.across_nodes()), servers_(ps_ranks) {
    leader_ = in_.rank() == 0;
    if (mine() >= 0) {  // this process is a server: the master copy of its shard and its optimizer state
      const auto [b, n] = shard(mine());
      master_.assign(t.params[0] + b, t.params[0] + b + n);
      opt_ = std::make_unique<OptimizerState>(*cpu_, optimizer, n);
    }
    timer_.levels = {{"node_reduce", "sum within each node", 0, 0, in_.size() > 1 ? 1.0 : 0.0, 0},
                     {"push_to_servers", "push to the parameter servers", 0, 0, 1.0, 0},
                     {"pull_from_servers", "pull from the parameter servers", 0, 0, 1.0, 0}};
  }

  std::string name() const override {
    return fmt::format("{} in two levels ({} node{} x {} process{}) to {} parameter server{} + host memory",
                       t_.group.size() > 1 ? t_.group.transport_name() : "host memory", across_.size(),
                       across_.size() == 1 ? "" : "s", in_.size(), in_.size() == 1 ? "" : "es", servers_,
                       servers_ == 1 ? "" : "s");
  }
  std::size_t bytes() const override { return t_.arena_bytes(); }
  double bus_factor() const override { return 1.0; }  // a reduce, as parameter_server's
  std::vector<SyncLevel> levels() const override {
    return t_.group.size() > 1 ? timer_.levels : std::vector<SyncLevel>{};
  }
  void trace_levels(bool on) override { timer_.trace(on); }
  std::vector<LevelSpan> take_level_spans() override { return timer_.take_spans(); }

  // The towers' sum in host memory, the node's onto its first process, then each server's part of
  // the bucket from every node's first process onto that server.
  void sync_bucket(std::size_t k) override {
    const std::size_t off = t_.buckets[k].first, n = t_.buckets[k].second;  // captured below
    float* sum = t_.grads[0] + off;
    Backend& be = *t_.towers[0]->be;
    for (std::size_t i = 1; i < t_.towers.size(); ++i)
      be.add(be.default_stream(), Tensor{t_.grads[i] + off, flat_of(n)}, Tensor{sum, flat_of(n)}, 1.0f);
    be.synchronize(be.default_stream());
    timer_.timed(0, static_cast<double>(n * sizeof(float)), [&] { in_.reduce_sum_to(sum, n, 0); });
    if (leader_)
      timer_.timed(1, static_cast<double>(n * sizeof(float)), [&] {
        for (int s = 0; s < servers_; ++s) {
          const auto [b, len] = overlap(off, n, s);
          if (len > 0) across_.reduce_sum_to(t_.grads[0] + b, len, server_node(s));
        }
      });
    // the average where a server holds the sum; elsewhere what the reduces left, kept bounded (grad_sync
    // alone, timed over and over, would otherwise grow it without end)
    be.scale(be.default_stream(), sum, 1.0f / static_cast<float>(t_.global_size()), n);
    be.synchronize(be.default_stream());
  }

  // Each server averages its shard's gradients and updates its master copy; every node's first
  // process gets every shard from its server, then the rest of the node from it; every tower copies
  // the variables in.
  void update() override {
    float* p = t_.params[0];
    if (mine() >= 0) {
      const auto [b, n] = shard(mine());
      auto& cs = cpu_->default_stream();
      opt_->update(cs, master_.data(), t_.grads[0] + b);
      cpu_->synchronize(cs);
      std::copy(master_.begin(), master_.end(), p + b);
    }
    timer_.timed(2, static_cast<double>(t_.arena_bytes()), [&] {
      if (leader_)
        for (int s = 0; s < servers_; ++s) {
          const auto [b, n] = shard(s);
          across_.broadcast_from(p + b, n, server_node(s));
        }
      in_.broadcast_from(p, t_.floats, 0);
    });
    Backend& be = *t_.towers[0]->be;
    for (std::size_t i = 1; i < t_.towers.size(); ++i) be.copy(be.default_stream(), t_.params[i], p, t_.arena_bytes());
    be.synchronize(be.default_stream());
  }

  void synchronize() const override { t_.synchronize_every_tower(); }

 private:
  // Server s's node (its first process serves), and the shard it owns: [F s / K, F (s + 1) / K).
  int server_node(int s) const { return s * across_.size() / servers_; }
  std::pair<std::size_t, std::size_t> shard(int s) const {
    const auto k = static_cast<std::size_t>(servers_);
    const auto b = t_.floats * static_cast<std::size_t>(s) / k;
    return {b, t_.floats * static_cast<std::size_t>(s + 1) / k - b};
  }
  // The part of [off, off + n) that server s owns: (begin, length).
  std::pair<std::size_t, std::size_t> overlap(std::size_t off, std::size_t n, int s) const {
    const auto [b, len] = shard(s);
    const std::size_t lo = std::max(off, b), hi = std::min(off + n, b + len);
    return {lo, hi > lo ? hi - lo : 0};
  }
  // The shard this process serves, or -1.
  int mine() const {
    if (!leader_) return -1;
    for (int s = 0; s < servers_; ++s)
      if (server_node(s) == across_.rank()) return s;
    return -1;
  }

  SyncTowers t_;
  const ProcessGroup& in_;
  const ProcessGroup& across_;
  int servers_;
  bool leader_ = false;
  std::unique_ptr<Backend> cpu_ = make_backend(BackendKind::cpu);
  std::vector<float> master_;
  std::unique_ptr<OptimizerState> opt_;
  LevelTimer timer_;
};

}  // namespace

std::unique_ptr<GradientSync> make_distributed_replicated_sync(const SyncTowers& t, const OptimizerConfig& optimizer,
                                                               int ps_ranks) {
  return std::make_unique<DistributedReplicatedSync>(t, optimizer, ps_ranks);
}

}  // namespace stepbench
