// The tower core: one model replica per device (GPU, or CPU "tower" on the cpu backend), each
// with its own backend, graph and optimizer state, and the gradient synchronisation between them
// in tf_cnn_benchmarks' variable-update modes:
//   replicated        every tower's gradients are all-reduced (averaged), every tower updates its
//                     own copy of the variables (identical results);
//   parameter_server  gradients are reduced (averaged) onto the server (tower 0 of process 0, or
//                     host memory with ps_on_host), which updates the variables and broadcasts
//                     them back to every tower;
//   independent       no synchronisation: each tower trains on its own;
//   distributed_all_reduce  replicated's all-reduce in two levels across processes: within each
//                     node, across the nodes, back within each node (CPU towers so far);
//   distributed_replicated  a sum within each node, the node sums pushed to parameter servers (the
//                     first process of ps_ranks nodes, the variables sharded over them) that update
//                     the master copy, every tower pulling the new values (CPU towers so far).
// parameter_server and distributed_replicated also run asynchronously (cross_replica_sync false).
// Each mode is a GradientSync (train/sync.hpp), chosen once by the constructor.
// Gradients move in buckets (contiguous ranges of the gradient arena, which is laid out in reverse
// execution order, so the first bucket is the first one backward finishes).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/registry.hpp"
#include "comm/collective.hpp"
#include "comm/process_group.hpp"
#include "graph/graph.hpp"
#include "models/models.hpp"

namespace stepbench {

class CommThread;    // comm/comm_thread.hpp
class GradientSync;  // train/sync.hpp
struct Replica;      // train/tower_parts.hpp

enum class VariableUpdate { replicated, parameter_server, independent, distributed_all_reduce, distributed_replicated };
constexpr auto enum_names(VariableUpdate) {
  return std::array<EnumName<VariableUpdate>, 5>{{{VariableUpdate::replicated, "replicated"},
                                                  {VariableUpdate::parameter_server, "parameter_server"},
                                                  {VariableUpdate::independent, "independent"},
                                                  {VariableUpdate::distributed_all_reduce, "distributed_all_reduce"},
                                                  {VariableUpdate::distributed_replicated, "distributed_replicated"}}};
}

// The asynchronous parameter servers' counts (--cross-replica-sync off), as this process saw them.
// A worker is a process (parameter_server) or a node (distributed_replicated, whose first process
// pushes the node's sum); a server holds one contiguous shard of the variables (parameter_server:
// one, on process 0; distributed_replicated: --ps-ranks of them).
struct AsyncStats {
  int worker = -1;            // the worker this process pushes for (its rank, or its node), or -1
  bool node_workers = false;  // workers are nodes
  int servers = 1;
  int serves = -1;               // the shard this process serves, or -1
  std::size_t shard_floats = 0;  // of that shard
  long pushes = 0;               // steps this process pushed (each to every server)
  double pushed_sum = 0;         // the sum of every element it pushed
  std::vector<long> versions;    // per server: the version of this worker's shard (updates applied then)
  // As the server: the shards it applied (each once), their sum, per pushing process (by rank), and
  // each one's staleness (how many of its updates behind it the pushing worker's shard was).
  long applied = 0;
  double applied_sum = 0;
  std::vector<double> staleness;
  std::vector<long> applied_per_worker;
  // With TowerOptions::async_checks (tests): every gradient this worker pushed, summed element by
  // element, and the first one as pushed; a hash of its variables in each server's shard; as a
  // server, its master copy and a hash of the shard of each version it sent (index: the version).
  std::vector<double> pushed_total;
  std::vector<float> first_push;
  std::vector<std::uint64_t> shard_hashes;
  std::vector<float> master;
  std::vector<std::uint64_t> sent_hashes;
};

struct TowerOptions {
  BackendKind backend = BackendKind::cpu;  // cpu or cuda (automatic is resolved here too)
  int towers = 1;
  std::int64_t batch_per_tower = 1;
  ModelKind model = ModelKind::inception_v3;
  ModelOptions model_options;
  Layout layout = Layout::nchw;
  Precision precision = Precision::fp32;
  Recompute recompute = Recompute::automatic;  // --recompute (graph.hpp)
  Fuse fuse = Fuse::off;                       // --fuse (graph.hpp)
  OptimizerConfig optimizer;
  VariableUpdate variable_update = VariableUpdate::replicated;
  std::size_t bucket_bytes = std::size_t{25} << 20;       // PyTorch DDP's default bucket size
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  // smaller, as DDP: the first ready starts sooner
  // In step(): start each bucket's sync on a communication thread as soon as backward has produced it,
  // overlapping the rest of backward (false: sync after backward, for comparison).
  bool overlap = true;
  std::uint64_t seed = 1;
  // Across processes (mpirun): these towers are one process's share, and the sync spans every
  // process of the group. nullptr: this process alone. The group must outlive the towers.
  ProcessGroup* group = nullptr;
  // parameter_server only: the variables live and are updated in host memory (--ps-device cpu, as
  // tf_cnn_benchmarks' --local_parameter_device=cpu); gradients are copied there and summed on the
  // CPU, and the new variables are copied back to every tower.
  bool ps_on_host = false;
  // distributed_replicated: the parameter servers the variables are sharded over (--ps-ranks), at
  // most one per node.
  int ps_ranks = 1;
  // parameter_server and distributed_replicated across processes: false (--cross-replica-sync off)
  // makes them asynchronous: each worker (a process; a node in distributed_replicated) pushes and
  // pulls without waiting for the others (CPU towers, Gloo).
  bool cross_replica_sync = true;
  // Tests: the asynchronous server keeps what AsyncStats' checks need (an arena of doubles per worker,
  // a hash per version), which the benchmark does not pay for.
  bool async_checks = false;
  // A gradient sync (or NCCL's initialisation) that has not completed after this many seconds ends
  // the run with SyncError (--sync-timeout-s); 0 waits forever.
  double sync_timeout_s = 600.0;
  // cuda: this many towers (of this process and the others on its node, in local-rank order) share
  // each GPU (--ranks-per-gpu; NCCL 2.30+ or a host id per process, which the command line sets up).
  // Tests of the multi-rank path on one GPU: their times are not scaling figures. `gpu_sharing`
  // says how (for the sync's name).
  int ranks_per_gpu = 1;
  std::string gpu_sharing;
  std::size_t workspace_bytes = std::size_t{512} << 20;  // cuDNN workspace per convolution (--workspace-mb)
  bool own_kernels = false;   // cuda: batch norm and pooling on stepbench's kernels (CudaBackendOptions)
  bool emulate_bf16 = false;  // cpu, tests only: BackendOptions::emulate_bf16
  // What planning may use per device (Backend::set_memory_limit, --device-memory-mb); 0: all it has.
  std::size_t memory_limit_bytes = 0;
  // cuda: the convolution plans every tower's backend looks up and records (--plan-cache FILE loads
  // one); null: the towers share one of their own, so each convolution is searched once per process.
  std::shared_ptr<ConvPlanCache> plans;
  // Fault injection for the timeout test: this process sleeps this long before its first bucket's
  // sync (the command line takes it from STEPBENCH_FAULT_SYNC_STALL); 0: never.
  double fault_sync_stall_s = 0;
  // Fault injection for NCCL's initialisation under the timeout: this process sleeps this long
  // between the unique id's broadcast and its ncclCommInitRankConfig (STEPBENCH_FAULT_INIT_STALL).
  double fault_init_stall_s = 0;
  // Fault injection for the regression gate's tests: one conv shape's work repeated
  // (backend/slow_conv.hpp; the command line takes it from STEPBENCH_FAULT_SLOW_CONV).
  SlowConvFault fault_slow_conv;

  DType dtype() const { return storage_dtype(precision); }
};

// A tower's graph for these options: its batch, layout, dtype, dropout seed, and room for the
// optimizer's state in its arena (the plan counts it).
GraphConfig graph_config(const TowerOptions& o, std::int64_t batch, std::uint64_t seed);

// The memory plan of one tower at this batch on this process's first device, sized without
// allocating anything (Graph::size_plan on a sizing-only backend: on CUDA each convolution's
// workspace is counted at the budget, --workspace-mb, without cuDNN's algorithm search; on the CPU
// the plan is the one a run makes). quick: the plan's peak before any op is made, a lower bound.
Graph::Sizing plan_memory(const TowerOptions& o, std::int64_t batch, bool quick = false);

// The largest batch per tower that the memory plan accepts on this process's first device for
// these options (model, image size, precision, layout, memory limit), known before anything is
// allocated: bisection on the plan's quick lower bound (plan_memory(quick)), then on the exact plan
// from there down (on CUDA it errs on the safe side by each convolution's workspace below the
// budget; on the CPU it is exact); so `batch` fits the plan for one tower and batch + 1 does not
// (unless at_cap). Across processes the smallest over the processes (a collective). batch 0: not even one
// image fits. It is one tower's answer: CPU towers of one process share the host's memory, so N of
// them need N x bytes.
struct BatchFit {
  std::int64_t batch = 0;
  std::size_t bytes = 0;       // what `batch` needs (the plan's arena)
  std::size_t next_bytes = 0;  // what batch + 1 needs (its plan's arena; 0 at the cap)
  std::size_t budget = 0;      // what the device gives planning (Backend::memory_budget)
  std::size_t usable = 0;      // what planning uses of it
  bool at_cap = false;         // the search stopped at its cap: larger batches were not tried
};
BatchFit largest_batch_that_fits(const TowerOptions& o, std::int64_t cap = std::int64_t{1} << 20);

// Where tower i of this process runs: its GPU (the node's towers in local-rank order, ranks_per_gpu
// to a GPU), and how many processes plan on that device's memory at once.
struct TowerPlace {
  int device = 0;
  int memory_share = 1;
};
TowerPlace tower_place(const TowerOptions& o, int tower);

class Towers {
 public:
  explicit Towers(const TowerOptions& o);
  ~Towers();
  Towers(const Towers&) = delete;
  Towers& operator=(const Towers&) = delete;

  int size() const { return static_cast<int>(towers_.size()); }  // towers in this process
  int global_size() const { return size() * processes_; }        // towers in every process
  int rank() const { return rank_; }
  int processes() const { return processes_; }
  const TowerOptions& options() const { return opt_; }
  Backend& backend(int i) const;
  Graph& graph(int i) const;
  Stream& stream(int i) const;
  const ModelInfo& model_info() const { return info_; }
  // What moves the gradients: "none", "host memory", "NCCL ...", "MPI ...".
  std::string sync_name() const;

  // Synthetic data: a fixed random batch and labels on every tower (different per tower).
  void set_synthetic_batch(std::uint64_t seed);

  // The phases. Each launches the work on every tower's stream and returns without waiting.
  void forward_inference();
  void forward_train();
  // start_sync: hand every gradient bucket to the communication thread as soon as backward has
  // produced it (with overlap on and something to sync); grad_sync() then waits for the rest.
  void backward(bool start_sync = false);
  void grad_sync();
  void update();
  void step();  // forward_train, backward, grad_sync, update

  // Tracing (bench/layer_times): with timing on, every bucket's sync records timing events, and
  // after a step and synchronize() bucket_spans(i, ref) gives tower i's buckets as device times in
  // ms since `ref` (an event recorded on its compute stream): from when the bucket was ready and
  // its communication stream (or thread) free, to the end of its sync.
  struct BucketSpan {
    std::size_t bucket;
    double begin_ms, end_ms;
  };
  void set_sync_timing(bool on);
  std::vector<BucketSpan> bucket_spans(int tower, Event& ref) const;
  // The step's timeline per tower (bench/straggler), with step timing on (it turns sync timing on
  // too): after a step and synchronize(), in ms since the process's reference (tower 0's start where
  // the towers share a clock, i.e. a device or the host; else the tower's own start): when its
  // forward began, how long forward and backward took, when each bucket was ready and its sync
  // ended, and when the sync released the tower to update.
  struct Timeline {
    double begin_ms = 0, forward_ms = 0, backward_ms = 0, released_ms = 0;
    std::vector<double> ready_ms, synced_ms;
  };
  void set_step_timing(bool on);
  Timeline timeline(int tower) const;
  // --slow-tower: tower `tower` of this process holds its stream for `ms` at the start of every
  // backward (Backend::delay), as a GPU that computes slower would; 0 removes it.
  void set_delay(int tower, double ms);
  // --cuda-graph: record one step (step = true) or one inference forward as a CUDA Graph, to replay
  // as a single launch from then on. Needs the cuda backend, one tower per process (NCCL across
  // processes is captured with it), the variables on the device and the graph's own input
  // (synthetic data); UsageError naming what to change otherwise. Replays repeat the captured step's
  // dropout masks (the step counter is a launch argument).
  void capture(bool step);
  void replay(bool step);
  // Waits for every tower. With NCCL it polls, and throws SyncError when the communicator reports
  // an error or the work has not finished within sync_timeout_s (it aborts the communicator first).
  void synchronize() const;

  // Gradient synchronisation: what one grad_sync moves, and nccl-tests' bus-bandwidth factor for
  // the collective the mode uses (allreduce 2(n-1)/n, reduce 1), 0 when nothing moves.
  std::size_t sync_bytes() const;
  // The levels of a sync done in several (distributed_all_reduce), timed on the host since the towers
  // were made (Collective::levels); empty otherwise.
  std::vector<SyncLevel> sync_levels() const;
  // --trace: while on, each level's calls are kept as spans (steady-clock ms), taken and cleared by
  // take_level_spans() after a step.
  void set_level_tracing(bool on);
  std::vector<LevelSpan> take_level_spans();
  // --cross-replica-sync off: the processes do not step together (the timing must not make them).
  bool asynchronous() const;
  AsyncStats async_stats() const;
  std::size_t bucket_count() const { return buckets_.size(); }
  const std::vector<std::pair<std::size_t, std::size_t>>& buckets() const { return buckets_; }  // (offset, floats)
  // How many buckets the last grad_sync() found already started during backward.
  std::size_t overlapped_buckets() const { return overlapped_; }
  double bus_factor() const;

  float loss(int tower) const;

  // Host batches staged to the device, double-buffered: two device buffers per tower; stage()
  // copies a host batch (images dense in the graph's layout, fp32, cast on the device for bf16 and
  // fp16 models; int32 labels) into the spare
  // buffer on the tower's copy stream, once the step that last read that buffer is done, and returns
  // when the copy is (so the host batch can be reused); flip() makes the next step read the
  // buffers just staged. The copy for step k+1 thus overlaps the compute of step k.
  void enable_staging();
  void stage(int tower, const float* images, const std::int32_t* labels);
  // The same with the images written on the device (--decode gpu): fill(copy stream, the spare
  // buffer as a dense fp32 batch tensor in the graph's layout) launches the work that writes it
  // there (and may wait for it), after which the buffer is cast and the labels copied as in stage().
  void stage_on_device(int tower, const std::function<void(Stream&, const Tensor&)>& fill, const std::int32_t* labels);
  void flip();
  // Timing of the staging (--trace): with it on, stage() and stage_on_device() record events around
  // their work on the copy stream; staging_span(i, ref) gives tower i's last one as device times in
  // ms since `ref` (an event of its compute stream), once, or nothing.
  void set_staging_timing(bool on);
  std::optional<std::pair<double, double>> staging_span(int tower, Event& ref);
  std::size_t input_bytes() const;   // the graph's input, in its precision
  std::size_t input_floats() const;  // its elements: what stage() reads

 private:
  TowerOptions opt_;
  ModelInfo info_;
  std::vector<std::unique_ptr<Replica>> towers_;
  std::vector<std::pair<std::size_t, std::size_t>> buckets_;  // (offset, count) in floats
  std::vector<float*> grads_, params_;
  int rank_ = 0, processes_ = 1;
  const ProcessGroup& group() const { return opt_.group ? *opt_.group : single_; }
  ProcessGroup single_;                 // the group when none is given: this process alone
  std::unique_ptr<GradientSync> sync_;  // the variable-update mode's; declared after towers_: destroyed first
  std::unique_ptr<CapturedWork> graph_step_, graph_forward_;  // destroyed before the collective they captured
  double stall_s_ = 0;                           // fault injection for the timeout test (STEPBENCH_FAULT_SYNC_STALL)
  void mark_ready(int tower);                    // every bucket's ready event not yet recorded, at the stream's end
  void launch(std::size_t k);                    // bucket k's sync: enqueued (NCCL) or handed to the comm thread
  void check_arena_layouts() const;              // UsageError where processes lay their arenas out differently
  void sync_on_host(std::size_t k);              // bucket k on this thread: the comm thread, or after backward
  void record_ready(Replica& t, std::size_t k);  // its ready event (and timed_ready with sync timing)
  void record_sync(std::size_t k, bool end);     // sync_begin or sync_end of bucket k on every tower
  bool sync_timing_ = false;
  bool step_timing_ = false;
  void record_step(Replica& t, std::unique_ptr<Event> Replica::*e);  // one timeline event, with step timing on
  std::unique_ptr<CommThread> comm_;  // declared after sync_: joined before the sync it calls goes
  std::size_t launched_ = 0;          // buckets handed to the communication thread this step
  std::size_t overlapped_ = 0;
  struct Staging;  // declared after towers_: destroyed before the backends it allocated from
  std::vector<std::unique_ptr<Staging>> staging_;
};

}  // namespace stepbench
