// The gradient sync between towers, one class per tf_cnn_benchmarks variable-update mode behind one
// interface (GradientSync), chosen once by make_gradient_sync:
//   replicated        (sync_replicated.cpp) every bucket is all-reduced (averaged) onto every tower,
//                     and every tower updates its own copy of the variables;
//   parameter_server  (sync_parameter_server.cpp) every bucket is reduced (averaged) onto the server,
//                     tower 0 of process 0, which alone updates and broadcasts the variables; with
//                     ps_on_host the server is host memory, updated by the cpu backend;
//   independent       (sync_independent.cpp) nothing moves, every tower updates its own;
//   distributed_all_reduce  replicated's sync over a two-level host collective (make_host_collective);
//   distributed_replicated  (sync_distributed_replicated.cpp) node sums pushed to sharded servers;
//   parameter_server, distributed_replicated with cross_replica_sync off (sync_async.cpp): workers
//                     (processes; nodes) push to the servers and pull on their own.
// Towers decides when buckets go (as backward produces them, or after it; on a communication
// thread when the sync runs on the host); the GradientSync decides what a bucket's sync and the
// update do. Internal to src/train.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/collective.hpp"
#include "train/tower_parts.hpp"

namespace stepbench {

// What a gradient sync works on: this process's towers and what Towers set up around them. Towers
// owns all of it and outlives the sync.
struct SyncTowers {
  const std::vector<std::unique_ptr<Replica>>& towers;
  const std::vector<std::pair<std::size_t, std::size_t>>& buckets;  // (offset, floats) in the gradient arena
  const std::vector<float*>& grads;                                 // per tower: its gradient arena
  const std::vector<float*>& params;                                // per tower: its parameter arena
  const ProcessGroup& group;                                        // this process alone, or every process
  std::size_t floats = 0;                                           // of each arena
  double sync_timeout_s = 0;                                        // TowerOptions::sync_timeout_s

  int global_size() const { return static_cast<int>(towers.size()) * group.size(); }
  std::size_t arena_bytes() const { return floats * sizeof(float); }
  // Every tower updates its own variables from its own gradients, on its compute stream.
  void update_every_tower() const;
  // Waits for every tower's compute stream.
  void synchronize_every_tower() const;
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // What moves the gradients: "none", "host memory", "NCCL ...", "MPI ...".
  virtual std::string name() const = 0;
  // What one grad_sync moves (0: nothing, and grad_sync does nothing), and nccl-tests' bus-bandwidth
  // factor for the mode's collective (allreduce 2(n-1)/n, reduce 1; 0 when nothing moves).
  virtual std::size_t bytes() const = 0;
  virtual double bus_factor() const = 0;
  // true: sync_bucket enqueues on the towers' communication streams and returns at once (NCCL), and
  // Towers makes each compute stream wait for its communication stream after the last bucket.
  // false: sync_bucket runs to completion on the calling thread (host memory, MPI, the host
  // server), which Towers overlaps with backward by calling it from a communication thread.
  virtual bool enqueued() const { return false; }
  // Bucket k's sync, once every tower's backward has recorded its ready[k] event (during backward
  // with overlap, or after it); the buckets come in order.
  virtual void sync_bucket(std::size_t k) = 0;
  // The update phase after the sync: every tower's optimizer, or the server's update and the
  // broadcast of the variables to every tower.
  virtual void update() = 0;
  // Waits for every tower's compute stream; with an enqueued collective it polls, and throws
  // SyncError when the collective reports an error or has not finished within sync_timeout_s.
  virtual void synchronize() const = 0;
  // Waits for stream `s` of backend `be` (a copy or communication stream whose work may wait on the
  // collective), under the same polling and timeout as synchronize().
  virtual void wait_for(Backend& be, Stream& s) const { be.synchronize(s); }
  // UsageError naming what to change when a CUDA Graph cannot capture this sync's work.
  virtual void check_capturable() const {}
  // The collective's levels where it runs in several (Collective::levels).
  virtual std::vector<SyncLevel> levels() const { return {}; }
  virtual void trace_levels(bool /*on*/) {}
  virtual std::vector<LevelSpan> take_level_spans() { return {}; }
  // true: the processes do not step together (the asynchronous parameter server), and its counts.
  virtual bool asynchronous() const { return false; }
  virtual AsyncStats async_stats() const { return {}; }
};

// The modes that average through a Collective (replicated; parameter_server on tower 0): host
// memory plus MPI for the cpu backend's towers, NCCL for GPU towers.
class CollectiveSync : public GradientSync {
 public:
  // coll: nullptr when nothing moves (one tower in all).
  CollectiveSync(const SyncTowers& t, std::unique_ptr<Collective> coll) : t_(t), coll_(std::move(coll)) {}
  std::string name() const override;
  std::size_t bytes() const override;  // every gradient, when there are at least two towers in all
  bool enqueued() const override { return coll_ && coll_->asynchronous(); }
  // Enqueued: each communication stream first waits for its tower's ready[k] event.
  void sync_bucket(std::size_t k) override;
  void synchronize() const override;
  void wait_for(Backend& be, Stream& s) const override;
  std::vector<SyncLevel> levels() const override { return coll_ ? coll_->levels() : std::vector<SyncLevel>{}; }
  void trace_levels(bool on) override {
    if (coll_) coll_->trace_levels(on);
  }
  std::vector<LevelSpan> take_level_spans() override {
    return coll_ ? coll_->take_level_spans() : std::vector<LevelSpan>{};
  }

 protected:
  // The mode's collective on one bucket: `count` floats at `off` of every tower's gradients.
  virtual void average(std::size_t off, std::size_t count) = 0;
  SyncTowers t_;
  std::unique_ptr<Collective> coll_;
};

// Refuses (UsageError or UnsupportedError, naming the flags) what the variable-update mode cannot
// do with these options; the Towers constructor calls it before building anything.
void check_sync_options(const TowerOptions& o);
// The mode's sync for these towers (the options as check_sync_options accepted them, the backend
// resolved). Makes the collective the mode needs (NCCL initialises its communicators here).
std::unique_ptr<GradientSync> make_gradient_sync(const TowerOptions& o, const SyncTowers& t);

// One per mode (make_gradient_sync chooses).
std::unique_ptr<GradientSync> make_replicated_sync(const SyncTowers& t, std::unique_ptr<Collective> coll);
std::unique_ptr<GradientSync> make_device_server_sync(const SyncTowers& t, std::unique_ptr<Collective> coll);
std::unique_ptr<GradientSync> make_host_server_sync(const SyncTowers& t, const OptimizerConfig& optimizer);
std::unique_ptr<GradientSync> make_independent_sync(const SyncTowers& t);
// servers: shards of the variables, each on the first process of a node; node_workers: each node's
// processes push as one worker (distributed_replicated), else each process (parameter_server).
std::unique_ptr<GradientSync> make_async_server_sync(const SyncTowers& t, const OptimizerConfig& optimizer, bool checks,
                                                     int servers, bool node_workers);
std::unique_ptr<GradientSync> make_distributed_replicated_sync(const SyncTowers& t, const OptimizerConfig& optimizer,
                                                               int ps_ranks);

}  // namespace stepbench
