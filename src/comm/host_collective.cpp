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
  HostCollective(Backend& be, int local, const ProcessGroup& group)
      : be_(be), group_(group), local_(local), procs_(group.size()) {}
  std::string name() const override {
    return procs_ > 1 ? fmt::format("{} over {} processes + host memory", group_.transport_name(), procs_)
                      : "host memory";
  }
  void allreduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    local_sum(bufs, off, count);
    if (procs_ > 1) group_.allreduce_sum(bufs[0] + off, count);
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
  Backend& be_;
  const ProcessGroup& group_;
  int local_, procs_;
};

}  // namespace

std::unique_ptr<Collective> make_host_collective(Backend& tower0, int local_towers, const ProcessGroup& group) {
  return std::make_unique<HostCollective>(tower0, local_towers, group);
}

}  // namespace stepbench
