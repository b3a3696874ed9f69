// Moving gradient and parameter buckets between towers: the Collective interface, and the two
// implementations (host memory plus MPI for the cpu backend's towers, NCCL for GPU towers).
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "comm/process_group.hpp"

namespace stepbench {

// One level of a collective done in several (--variable-update distributed_all_reduce), timed on
// the host over every call since the collective was made.
struct SyncLevel {
  std::string key;        // for counters and --json: "node_reduce_scatter"
  std::string name;       // "reduce-scatter within each node"
  double seconds = 0;     // summed over the calls
  double bytes = 0;       // summed: what nccl-tests' algbw divides by the time
  double bus_factor = 0;  // nccl-tests' for the level's collective over its processes
  long calls = 0;
};

// One call of a level, while traced (--trace): steady-clock ms (the clock bench/layer_times' trace
// counts from).
struct LevelSpan {
  std::size_t level;
  double begin_ms, end_ms;
};

// The levels of a sync done in several and their timing: each call's host time into its SyncLevel
// and, while traced, its span (kept until taken; the thread that syncs records, another takes).
// `levels` is read by others only after the sync's wait (CommThread::wait), which orders the writes.
class LevelTimer {
 public:
  std::vector<SyncLevel> levels;
  template <class F>
  void timed(std::size_t level, double bytes, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    SyncLevel& l = levels.at(level);
    l.seconds += std::chrono::duration<double>(t1 - t0).count();
    l.bytes += bytes;
    ++l.calls;
    const std::lock_guard lock(mu_);
    if (trace_) spans_.push_back({level, ms(t0), ms(t1)});
  }
  void trace(bool on) {
    const std::lock_guard lock(mu_);
    trace_ = on;
    if (!on) spans_.clear();
  }
  std::vector<LevelSpan> take_spans() {
    const std::lock_guard lock(mu_);
    return std::exchange(spans_, {});
  }

 private:
  static double ms(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(t.time_since_epoch()).count();
  }
  std::mutex mu_;
  bool trace_ = false;
  std::vector<LevelSpan> spans_;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual std::string name() const = 0;
  // true: the calls enqueue on the streams the collective was made with and return at once.
  virtual bool asynchronous() const { return false; }
  // Asynchronous ones: throws SyncError (after abort()) when the communicator reported an error.
  virtual void check() {}
  // Ends the communicator so that work waiting on it returns (a hung collective). Returns within a
  // bounded time: an end that does not come by then is left to run on (its resources leaked).
  virtual void abort() {}
  // Average `count` floats at offset `off` of every tower's buffer; result on every tower.
  virtual void allreduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) = 0;
  // Average onto tower 0 only.
  virtual void reduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) = 0;
  // Copy tower 0's range to every other tower.
  virtual void broadcast(const std::vector<float*>& bufs, std::size_t off, std::size_t count) = 0;
  // The levels of allreduce_average, in order, where it runs in several; empty otherwise.
  virtual std::vector<SyncLevel> levels() const { return {}; }
  // While on, each level's calls are kept as spans, taken (and cleared) by take_level_spans().
  virtual void trace_levels(bool /*on*/) {}
  virtual std::vector<LevelSpan> take_level_spans() { return {}; }
};

// Runs `fn` on a thread of its own and waits at most `seconds` for it: true when it returned in time.
// Otherwise the thread is left running (detached) and false comes back. For calls that may block
// on a peer that is gone (ncclCommAbort, seen hanging: NVIDIA/nccl#549, #863, #992).
bool run_within(std::function<void()> fn, double seconds);

// Towers whose memory the host can address (the cpu backend): sums on tower 0's backend, then,
// across the processes of `group` (when it has more than one), with MPI or Gloo on tower 0's
// buffer. Runs to completion on the calling thread. two_level: the all-reduce across processes in
// the group's levels (ProcessGroup::within_node, across_nodes), as tf_cnn_benchmarks'
// distributed_all_reduce: a reduce-scatter within each node (one reduce per shard, each onto the
// process that owns it), an all-reduce of each shard across the nodes among the processes that own
// it, and an all-gather back within each node (one broadcast per shard); each level timed (levels()).
std::unique_ptr<Collective> make_host_collective(Backend& tower0, int local_towers, const ProcessGroup& group,
                                                 bool two_level = false);

// NCCL over the towers' GPUs, one rank per tower, its collectives enqueued on `streams` (one per
// tower, made by that tower's backend). The towers of every process of `group` form one
// communicator: process 0 makes the unique id and the group broadcasts it (MPI or Gloo), as
// nccl-tests does. Initialisation is non-blocking and polled: SyncError after opt.init_timeout_s
// (0: forever) or when NCCL fails. Throws UnsupportedError when stepbench was built without CUDA.
struct NcclOptions {
  double init_timeout_s = 600;  // --sync-timeout-s
  std::string sharing;          // how ranks share a GPU, for name(): "" when each has its own
  double fault_stall_s = 0;     // test only: sleep this long between the id's broadcast and the initialisation
  // allreduce_average in two levels over communicators split by node (ncclCommSplit), as
  // tf_cnn_benchmarks' distributed_all_reduce: a reduce-scatter within each node, an all-reduce of each
  // GPU's share across the nodes, an all-gather within the node (the group's levels give the nodes)
  bool two_level = false;
};
std::unique_ptr<Collective> make_nccl_collective(const std::vector<Backend*>& towers,
                                                 const std::vector<Stream*>& streams, const ProcessGroup& group,
                                                 const NcclOptions& opt = {});
// The loaded NCCL's version (ncclGetVersion: 22807 for 2.28.7), 0 without CUDA; and as "2.28.7".
int nccl_version();
std::string nccl_version_string();

// What NCCL needs in the environment before it initialises, for several ranks (the library sets none
// itself; the command line and the tests do): connections made while the communicators initialise
// (NCCL_RUNTIME_CONNECT=0), which stepbench polls under the sync timeout, rather than inside the first
// collective, which nothing could time out. For several ranks on each GPU, NCCL 2.30 and later take them
// with NCCL_MULTI_RANK_GPU_ENABLE (experimental; NVLS off, few CTAs per collective so the ranks do
// not starve each other); before that a host id per process makes NCCL take the ranks for separate
// nodes that talk over sockets (NCCL_NET=Socket), which works for one rank per process only (several
// towers of one process on one GPU: NCCL refuses them, "Duplicate GPU detected": `refused`).
struct GpuSharing {
  struct Var {
    std::string name, value;
    bool overwrite;  // false: a value the user set is kept
  };
  std::vector<Var> env;
  std::string how;       // for the run's report: "" when each rank has a GPU of its own
  bool refused = false;  // NCCL would refuse it: `how` says why and what to do instead
};
// one_host: every process runs on this host (the ranks then talk over loopback before 2.30).
GpuSharing nccl_gpu_sharing(int version, int ranks_per_gpu, int towers_per_process, int processes, int rank,
                            const std::string& host, bool one_host);

}  // namespace stepbench
