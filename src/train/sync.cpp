// What the gradient syncs share: the towers' helpers, the collective modes' bucket sync and polling
// wait, the option checks and the factory that chooses the mode's sync.
#include "train/sync.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "tensor/error.hpp"

namespace stepbench {

void SyncTowers::update_every_tower() const {
  for (const auto& t : towers) t->tr->update(t->compute());
}

void SyncTowers::synchronize_every_tower() const {
  for (const auto& t : towers) t->be->synchronize(t->compute());
}

std::string CollectiveSync::name() const { return bytes() == 0 ? "none" : coll_->name(); }

std::size_t CollectiveSync::bytes() const {
  return t_.global_size() < 2 ? 0 : t_.arena_bytes();  // one tower with its variables: nothing moves
}

void CollectiveSync::sync_bucket(std::size_t k) {
  if (enqueued())
    for (const auto& t : t_.towers) t->be->wait(*t->comm, *t->ready[k]);  // the comm stream waits for backward
  const auto [off, n] = t_.buckets[k];
  average(off, n);
}

void CollectiveSync::synchronize() const {
  if (!enqueued()) {
    t_.synchronize_every_tower();
    return;
  }
  for (const auto& t : t_.towers) wait_for(*t->be, t->compute());
}

void CollectiveSync::wait_for(Backend& be, Stream& s) const {
  if (!enqueued()) {
    be.synchronize(s);
    return;
  }
  // Poll, as nccl-tests does: a hung collective must end the run, not block it in the driver. While
  // it polls, this process is waiting on the group: a peer's liveness ask does not name it.
  const auto waiting = t_.group.waiting();
  const auto t0 = std::chrono::steady_clock::now();
  while (!be.query(s)) {
    coll_->check();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (t_.sync_timeout_s > 0 && waited > t_.sync_timeout_s) {
      // who is silent first (under MPI the well ranks time out about now too, and exchange their
      // tokens in step; an abort that takes its time, bounded by Collective::abort, would put them out)
      const double window = std::clamp(t_.sync_timeout_s / 4, 2.0, 10.0);
      const std::string who = t_.group.silent_ranks(window, stalled_after(t_.sync_timeout_s, window));
      coll_->abort();
      throw SyncError(fmt::format(
          "the GPUs' work with the gradient sync ({}) did not complete within {:g} s on process {} of {}: {}. If the "
          "step is legitimately that slow, raise --sync-timeout-s (0 waits forever)",
          coll_->name(), t_.sync_timeout_s, t_.group.rank(), t_.group.size(),
          who.empty() ? "a peer failed or stalled" : who));
    }
    std::this_thread::yield();
  }
  coll_->check();
}

namespace {
std::string servers_on_cpu_only() {
  return "--variable-update distributed_replicated runs on CPU towers so far (its parameter servers hold the "
         "master copy in host memory); on GPUs use distributed_all_reduce, replicated or parameter_server, or "
         "--backend cpu";
}
void check_levels(const ProcessGroup& g, VariableUpdate v) {
  if (!g.has_levels())
    throw UsageError(
        fmt::format("--variable-update {} needs every node to have the same number of processes: {}; "
                    "launch as many on each node, or use replicated",
                    to_string(v), g.levels_why()));
}
// --cross-replica-sync off: workers of their own (processes, or nodes) and a thread that answers them.
void check_async(const ProcessGroup& g, bool node_workers) {
  if (node_workers ? g.across_nodes().size() < 2 : g.size() < 2)
    throw UsageError(
        node_workers
            ? "--cross-replica-sync off with distributed_replicated needs several nodes as its workers (stepbench "
              "launch --nproc N --nodes M); the processes of one node step together"
            : "--cross-replica-sync off needs several processes as its workers (stepbench launch --nproc N); the "
              "towers of one process step together");
  if (g.uses_mpi())
    throw UsageError(
        "--cross-replica-sync off needs the processes to meet through Gloo (stepbench launch, torchrun, srun, or "
        "mpirun with --rendezvous): its servers answer on a thread of their own, which MPI's serialised threads "
        "do not allow");
}
}  // namespace

void check_sync_options(const TowerOptions& o) {
  if (o.variable_update == VariableUpdate::distributed_replicated && o.backend == BackendKind::cuda)
    throw UnsupportedError(servers_on_cpu_only());
  if (o.ps_ranks != 1 && o.variable_update != VariableUpdate::distributed_replicated)
    throw UsageError("--ps-ranks applies to --variable-update distributed_replicated only");
  if (o.ps_ranks < 1) throw UsageError("--ps-ranks must be 1 or more");
  if (!o.cross_replica_sync) {
    if (o.variable_update != VariableUpdate::parameter_server &&
        o.variable_update != VariableUpdate::distributed_replicated)
      throw UsageError(
          fmt::format("--cross-replica-sync off applies to --variable-update parameter_server and "
                      "distributed_replicated (their workers push and pull on their own); {} syncs every step",
                      to_string(o.variable_update)));
    if (o.backend == BackendKind::cuda)
      throw UnsupportedError("--cross-replica-sync off runs on CPU towers so far; use --backend cpu");
  }
  if (o.ps_on_host && o.variable_update != VariableUpdate::parameter_server)
    throw UsageError("--ps-device cpu applies to --variable-update parameter_server only");
  if (o.sync_timeout_s < 0) throw UsageError("--sync-timeout-s must be 0 (wait forever) or more");
  if (o.precision == Precision::fp16 && o.variable_update == VariableUpdate::parameter_server)
    throw UnsupportedError(
        "--precision fp16 with parameter_server: the dynamic loss scale lives on each tower and "
        "only the server updates, so the towers' scales would drift apart (not implemented); use "
        "--variable-update replicated, or --precision bf16, which needs no loss scaling");
}

namespace {

// What moves the collective modes' buckets: host memory (plus MPI across processes) between the cpu
// backend's towers; NCCL between GPU towers, when there are at least two in all.
std::unique_ptr<Collective> make_collective(const TowerOptions& o, const SyncTowers& t, bool two_level = false) {
  if (o.backend == BackendKind::cpu) return make_host_collective(*t.towers[0]->be, o.towers, t.group, two_level);
  if (t.global_size() < 2) return nullptr;
  std::vector<Backend*> bes;
  std::vector<Stream*> comm_streams;
  for (const auto& r : t.towers) {
    bes.push_back(r->be.get());
    comm_streams.push_back(r->comm.get());
  }
  return make_nccl_collective(bes, comm_streams, t.group,
                              NcclOptions{o.sync_timeout_s, o.gpu_sharing, o.fault_init_stall_s, two_level});
}

}  // namespace

std::unique_ptr<GradientSync> make_gradient_sync(const TowerOptions& o, const SyncTowers& t) {
  switch (o.variable_update) {
    case VariableUpdate::replicated: return make_replicated_sync(t, make_collective(o, t));
    case VariableUpdate::distributed_all_reduce:
      check_levels(t.group, o.variable_update);
      return make_replicated_sync(t, make_collective(o, t, true));
    case VariableUpdate::distributed_replicated:
      if (o.backend != BackendKind::cpu) throw UnsupportedError(servers_on_cpu_only());
      check_levels(t.group, o.variable_update);
      if (o.ps_ranks > t.group.across_nodes().size())
        throw UsageError(fmt::format("--ps-ranks {}: at most one parameter server per node, and there {} {}",
                                     o.ps_ranks, t.group.across_nodes().size() == 1 ? "is" : "are",
                                     t.group.across_nodes().size()));
      if (!o.cross_replica_sync) {
        check_async(t.group, true);
        return make_async_server_sync(t, o.optimizer, o.async_checks, o.ps_ranks, true);
      }
      return make_distributed_replicated_sync(t, o.optimizer, o.ps_ranks);
    case VariableUpdate::parameter_server:
      if (!o.cross_replica_sync) {
        check_async(t.group, false);
        return make_async_server_sync(t, o.optimizer, o.async_checks, 1, false);
      }
      return o.ps_on_host ? make_host_server_sync(t, o.optimizer) : make_device_server_sync(t, make_collective(o, t));
    case VariableUpdate::independent: return make_independent_sync(t);
  }
  throw Error(fmt::format("unknown variable update {}", static_cast<int>(o.variable_update)));
}

}  // namespace stepbench
