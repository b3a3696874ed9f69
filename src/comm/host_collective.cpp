// The cpu backend's collective: host memory between one process's towers, MPI or Gloo between the
// processes, flat or in two levels.
#include <fmt/format.h>

#include "comm/collective.hpp"

namespace stepbench {
namespace {

TensorDesc flat(std::size_t count) {
  return TensorDesc::dense(Shape{1, static_cast<std::int64_t>(count), 1, 1}, DType::f32, Layout::nchw);
}

// Towers whose memory the host can address (the cpu backend): sums on tower 0's backend, then, under
// mpirun, across the processes with MPI on tower 0's buffer.
class HostCollective final : public Collective {
 public:
  HostCollective(Backend& be, int local, const ProcessGroup& group, bool two_level)
      : be_(be), group_(group), local_(local), procs_(group.size()), two_level_(two_level) {
    if (!two_level_) return;
    const double in = group.within_node().size(), across = group.across_nodes().size();
    timer_.levels = {{"node_reduce_scatter", "reduce-scatter within each node", 0, 0, (in - 1) / in, 0},
                     {"cross_node_all_reduce", "all-reduce across the nodes", 0, 0, 2 * (across - 1) / across, 0},
                     {"node_all_gather", "all-gather within each node", 0, 0, (in - 1) / in, 0}};
  }
  std::string name() const override {
    if (procs_ > 1 && two_level_)
      return fmt::format("{} in two levels ({} node{} x {} process{}) + host memory", group_.transport_name(),
                         group_.across_nodes().size(), group_.across_nodes().size() == 1 ? "" : "s",
                         group_.within_node().size(), group_.within_node().size() == 1 ? "" : "es");
    return procs_ > 1 ? fmt::format("{} over {} processes + host memory", group_.transport_name(), procs_)
                      : "host memory";
  }
  std::vector<SyncLevel> levels() const override { return procs_ > 1 ? timer_.levels : std::vector<SyncLevel>{}; }
  void trace_levels(bool on) override { timer_.trace(on); }
  std::vector<LevelSpan> take_level_spans() override { return timer_.take_spans(); }
  void allreduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    local_sum(bufs, off, count);
    if (procs_ > 1 && two_level_)
      two_level_sum(bufs[0] + off, count);
    else if (procs_ > 1)
      group_.allreduce_sum(bufs[0] + off, count);
    be_.scale(be_.default_stream(), bufs[0] + off, 1.0f / static_cast<float>(local_ * procs_), count);
    local_copy(bufs, off, count);
  }
  void reduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    local_sum(bufs, off, count);
    if (procs_ > 1) group_.reduce_sum_to_root(bufs[0] + off, count);  // the average is only meaningful on process 0
    be_.scale(be_.default_stream(), bufs[0] + off, 1.0f / static_cast<float>(local_ * procs_), count);
  }
  void broadcast(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    if (procs_ > 1) group_.broadcast_from_root(bufs[0] + off, count);
    local_copy(bufs, off, count);
  }

 private:
  void local_sum(const std::vector<float*>& bufs, std::size_t off, std::size_t count) {
    auto& s = be_.default_stream();
    const Tensor dst{bufs[0] + off, flat(count)};
    for (std::size_t i = 1; i < bufs.size(); ++i) be_.add(s, Tensor{bufs[i] + off, flat(count)}, dst, 1.0f);
    be_.synchronize(s);
  }
  void local_copy(const std::vector<float*>& bufs, std::size_t off, std::size_t count) {
    auto& s = be_.default_stream();
    for (std::size_t i = 1; i < bufs.size(); ++i) be_.copy(s, bufs[i] + off, bufs[0] + off, count * sizeof(float));
  }
  // Shard s of a bucket of n floats: [n s / L, n (s + 1) / L) for the L processes of a node.
  static std::pair<std::size_t, std::size_t> shard(std::size_t n, int s, int parts) {
    const auto b = n * static_cast<std::size_t>(s) / static_cast<std::size_t>(parts);
    return {b, n * static_cast<std::size_t>(s + 1) / static_cast<std::size_t>(parts) - b};
  }
  void two_level_sum(float* p, std::size_t n) {
    const ProcessGroup& in = group_.within_node();
    const ProcessGroup& across = group_.across_nodes();
    const int parts = in.size();
    const double all = static_cast<double>(n * sizeof(float));
    timer_.timed(0, all, [&] {
      for (int s = 0; s < parts; ++s) {
        const auto [b, k] = shard(n, s, parts);
        in.reduce_sum_to(p + b, k, s);
      }
    });
    const auto mine = shard(n, in.rank(), parts);  // not a structured binding: the lambda captures it
    const std::size_t mb = mine.first, mk = mine.second;
    timer_.timed(1, static_cast<double>(mk * sizeof(float)), [&] { across.allreduce_sum(p + mb, mk); });
    timer_.timed(2, all, [&] {
      for (int s = 0; s < parts; ++s) {
        const auto [b, k] = shard(n, s, parts);
        in.broadcast_from(p + b, k, s);
      }
    });
  }
  Backend& be_;
  const ProcessGroup& group_;
  int local_, procs_;
  bool two_level_;
  LevelTimer timer_;
};

}  // namespace

std::unique_ptr<Collective> make_host_collective(Backend& tower0, int local_towers, const ProcessGroup& group,
                                                 bool two_level) {
  return std::make_unique<HostCollective>(tower0, local_towers, group, two_level);
}

}  // namespace stepbench
