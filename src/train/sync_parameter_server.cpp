// parameter_server: every bucket is reduced (averaged) onto the server, which alone updates the
// variables and broadcasts them to every tower (the broadcast is part of the update). The server is
// tower 0 of process 0 (DeviceServerSync), or host memory (HostServerSync, --ps-device cpu, as
// tf_cnn_benchmarks' --local_parameter_device=cpu).
#include <fmt/format.h>

#include <algorithm>

#include "tensor/error.hpp"
#include "train/sync.hpp"

namespace stepbench {
namespace {

TensorDesc flat(std::size_t count) {
  return TensorDesc::dense(Shape{1, static_cast<std::int64_t>(count), 1, 1}, DType::f32, Layout::nchw);
}

class DeviceServerSync final : public CollectiveSync {
 public:
  using CollectiveSync::CollectiveSync;
  double bus_factor() const override { return bytes() == 0 ? 0.0 : 1.0; }  // reduce

  void update() override {
    if (t_.global_size() < 2) {  // the only tower is the server
      t_.update_every_tower();
      return;
    }
    // the server is tower 0 of process 0: it alone applies the update, then everyone gets the result
    Replica& t0 = *t_.towers[0];
    if (t_.group.rank() == 0) t0.tr->update(t0.compute());
    if (enqueued()) {
      for (const auto& t : t_.towers) t->comm_after_compute();
      coll_->broadcast(t_.params, 0, t_.floats);
      for (const auto& t : t_.towers) t->compute_after_comm();
      return;
    }
    t0.be->synchronize(t0.compute());
    for (auto [off, n] : t_.buckets) coll_->broadcast(t_.params, off, n);
  }

 private:
  void average(std::size_t off, std::size_t count) override { coll_->reduce_average(t_.grads, off, count); }
};

// The parameter server in host memory: the variables, their summed gradients and the optimizer
// state, updated by the cpu backend; pinned where the towers' backend pins. It applies even to one
// tower (the variables still go to the host and back).
class HostServerSync final : public GradientSync {
 public:
  HostServerSync(const SyncTowers& t, const OptimizerConfig& optimizer) : t_(t) {
    std::size_t largest = 0;
    for (auto [off, n] : t.buckets) largest = std::max(largest, n);
    Backend& be0 = *t.towers[0]->be;
    params_ = HostBuffer(be0, t.arena_bytes());
    grads_ = HostBuffer(be0, t.arena_bytes());
    for (std::size_t i = 1; i < t.towers.size(); ++i) tmp_.emplace_back(be0, largest * sizeof(float));
    be0.copy(be0.default_stream(), params_.get(), t.params[0], t.arena_bytes());
    be0.synchronize(be0.default_stream());
    opt_ = std::make_unique<OptimizerState>(*cpu_, optimizer, t.floats);
  }

  std::string name() const override {
    const int processes = t_.group.size();
    return processes > 1 ? fmt::format("host memory (parameter server on the CPU) + {} over {} processes",
                                       t_.group.transport_name(), processes)
                         : "host memory (parameter server on the CPU)";
  }
  std::size_t bytes() const override { return t_.arena_bytes(); }
  double bus_factor() const override { return bytes() == 0 ? 0.0 : 1.0; }

  // Every tower's bucket to host memory on its communication stream (after backward produced it),
  // summed on the CPU, then across processes onto process 0; averaged.
  void sync_bucket(std::size_t k) override {
    const auto [off, n] = t_.buckets[k];
    float* sum = grads_.as<float>() + off;
    for (std::size_t i = 0; i < t_.towers.size(); ++i) {
      Replica& t = *t_.towers[i];
      t.be->wait(*t.comm, *t.ready[k]);
      t.be->copy(*t.comm, i == 0 ? sum : tmp_[i - 1].as<float>(), t_.grads[i] + off, n * sizeof(float));
    }
    Backend& cpu = *cpu_;
    auto& cs = cpu.default_stream();
    for (std::size_t i = 0; i < t_.towers.size(); ++i) {
      t_.towers[i]->be->synchronize(*t_.towers[i]->comm);
      if (i > 0) cpu.add(cs, Tensor{tmp_[i - 1].get(), flat(n)}, Tensor{sum, flat(n)}, 1.0f);
    }
    if (t_.group.size() > 1) t_.group.reduce_sum_to_root(sum, n);
    cpu.scale(cs, sum, 1.0f / static_cast<float>(t_.global_size()), n);
  }

  // The server updates the variables in host memory (process 0), every process gets them, and
  // every tower copies them in on its stream, before its next forward.
  void update() override {
    float* p = params_.as<float>();
    if (t_.group.rank() == 0) opt_->update(cpu_->default_stream(), p, grads_.as<float>());
    if (t_.group.size() > 1) t_.group.broadcast_from_root(p, t_.floats);
    for (std::size_t i = 0; i < t_.towers.size(); ++i)
      t_.towers[i]->be->copy(t_.towers[i]->compute(), t_.params[i], p, t_.arena_bytes());
  }

  void synchronize() const override { t_.synchronize_every_tower(); }
  void check_capturable() const override {
    throw UsageError("--cuda-graph cannot capture the host parameter server's CPU work; use --ps-device device");
  }

 private:
  SyncTowers t_;
  std::unique_ptr<Backend> cpu_ = make_backend(BackendKind::cpu);
  HostBuffer params_, grads_;
  std::vector<HostBuffer> tmp_;  // per tower but the first: one bucket of its gradients
  std::unique_ptr<OptimizerState> opt_;
};

}  // namespace

std::unique_ptr<GradientSync> make_device_server_sync(const SyncTowers& t, std::unique_ptr<Collective> coll) {
  return std::make_unique<DeviceServerSync>(t, std::move(coll));
}

std::unique_ptr<GradientSync> make_host_server_sync(const SyncTowers& t, const OptimizerConfig& optimizer) {
  return std::make_unique<HostServerSync>(t, optimizer);
}

}  // namespace stepbench
