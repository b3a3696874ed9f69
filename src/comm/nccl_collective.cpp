// NCCL between GPU towers: one communicator rank per tower, collectives enqueued on each tower's
// communication stream, grouped so that one thread can drive several GPUs. Process 0 makes the
// unique id and the group broadcasts it (MPI or Gloo); every process then initialises its towers'
// ranks in one group, non-blocking, and polls them under the sync timeout, so that a peer that
// never reaches the initialisation ends the run instead of hanging it. The communicators the step
// uses are then split off as blocking ones: a non-blocking communicator hands every group to a
// thread of NCCL's, a cost inside each timed collective. Any failure aborts the communicators
// (ncclCommDestroy would wait for peers that may be gone). In two levels (NcclOptions::two_level)
// two more are split off: the GPUs of each node, and the GPUs that hold the same share in every node.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/check.hpp"
#include "comm/collective.hpp"

namespace stepbench {
namespace {

// ncclGroupStart ... ncclGroupEnd, closed on every path: an exception between them would leave
// NCCL's group open on this thread, and the next call would join it.
class NcclGroup {
 public:
  NcclGroup() { SB_NCCL(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  // ncclSuccess, or ncclInProgress for non-blocking communicators (then poll them).
  ncclResult_t end() {
    open_ = false;
    const ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress)
      throw_error(__FILE__, __LINE__,
                  fmt::format("ncclGroupEnd failed: {} ({})", ncclGetErrorString(r), ncclGetLastError(nullptr)));
    return r;
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

 private:
  bool open_ = true;
};

// Communicators that are aborted unless handed on: a constructor that throws leaves none behind.
struct Comms {
  std::vector<ncclComm_t> c;
  ~Comms() {
    for (auto x : c)
      if (x) ncclCommAbort(x);
  }
  std::vector<ncclComm_t> release() { return std::exchange(c, {}); }
};

class NcclCollective final : public Collective {
 public:
  NcclCollective(const std::vector<Backend*>& towers, const std::vector<Stream*>& streams, const ProcessGroup& group,
                 const NcclOptions& opt)
      : group_(group),
        processes_(group.size()),
        rank_(group.rank()),
        timeout_s_(opt.init_timeout_s),
        sharing_(opt.sharing),
        two_level_(opt.two_level) {
    SB_CHECK(!towers.empty() && towers.size() == streams.size(), "one stream per tower");
    for (std::size_t i = 0; i < towers.size(); ++i) {
      devices_.push_back(towers[i]->device());
      SB_CHECK(devices_.back() >= 0, "NCCL needs towers on the cuda backend");
      streams_.push_back(static_cast<cudaStream_t>(streams[i]->native_handle()));
    }
    const int local = static_cast<int>(devices_.size()), ranks = local * processes_;
    int previous = 0;  // the caller's current device, restored at the end
    SB_CUDA(cudaGetDevice(&previous));
    ncclUniqueId id{};
    if (rank_ == 0) SB_NCCL(ncclGetUniqueId(&id));
    group.broadcast_bytes_from_root(&id, sizeof id);
    if (opt.fault_stall_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(opt.fault_stall_s));

    // Declared before `init`, so destroyed after it: aborting a non-blocking parent joins its split's
    // thread, which writes the child into these slots on its way out.
    Comms blocking;  // what the step uses
    blocking.c.assign(devices_.size(), nullptr);
    Comms node, cross;  // two levels: the GPUs of this node; those of the same share in every node
    Comms init;         // non-blocking: the initialisation is polled under the timeout
    init.c.assign(devices_.size(), nullptr);
    {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = 0;
      NcclGroup g;
      for (int i = 0; i < local; ++i) {
        SB_CUDA(cudaSetDevice(devices_[static_cast<std::size_t>(i)]));
        init_call(ncclCommInitRankConfig(&init.c[static_cast<std::size_t>(i)], ranks, id, rank_ * local + i, &cfg));
      }
      g.end();
    }
    wait_ready(init.c, "NCCL's initialisation (ncclCommInitRankConfig)");
    // tower i's communicator in `out`, split off with color(i) and key(i), blocking
    const auto split = [&](Comms& out, const auto& color, const auto& key, const char* what) {
      out.c.assign(devices_.size(), nullptr);
      {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 1;
        NcclGroup g;
        for (int i = 0; i < local; ++i) {
          SB_CUDA(cudaSetDevice(devices_[static_cast<std::size_t>(i)]));
          init_call(ncclCommSplit(init.c[static_cast<std::size_t>(i)], color(i), key(i),
                                  &out.c[static_cast<std::size_t>(i)], &cfg));
        }
        g.end();
      }
      wait_ready(init.c, what);
      wait_ready(out.c, what);
    };
    split(
        blocking, [](int) { return 0; }, [&](int i) { return rank_ * local + i; },
        "the split into blocking communicators (ncclCommSplit)");
    if (two_level_) {
      // within a node: its processes' towers in order; across: the towers at the same place in
      // every node, in node order
      const ProcessGroup& in = group.within_node();
      const ProcessGroup& across = group.across_nodes();
      node_gpus_ = in.size() * local;
      nodes_ = across.size();
      const auto place = [&](int i) { return in.rank() * local + i; };
      split(
          node, [&](int) { return across.rank(); }, place, "the split by node (ncclCommSplit)");
      split(
          cross, place, [&](int) { return across.rank(); }, "the split across the nodes (ncclCommSplit)");
      for (int i = 0; i < local; ++i) {
        int r = -1;
        SB_NCCL(ncclCommUserRank(node.c[static_cast<std::size_t>(i)], &r));
        SB_CHECK(r == place(i), "a tower's rank in its node's communicator is its place in the node");
        node_rank_.push_back(r);
      }
    }
    for (auto c : init.c) ncclCommFinalize(c);
    wait_ready(init.c, "the release of the initial communicators (ncclCommFinalize)");
    for (auto& c : init.c) ncclCommDestroy(std::exchange(c, nullptr));
    comms_ = blocking.release();
    node_ = node.release();
    cross_ = cross.release();
    SB_CUDA(cudaSetDevice(previous));
  }
  ~NcclCollective() override {
    for (auto* v : {&comms_, &node_, &cross_})
      for (auto c : *v) {
        if (!c) continue;
        if (failed_)
          ncclCommAbort(c);  // peers may be gone: destroy would wait for them
        else
          ncclCommDestroy(c);
      }
  }

  std::string name() const override {
    return fmt::format("NCCL {}, {} ranks{}{}{}", nccl_version_string(),
                       comms_.size() * static_cast<std::size_t>(processes_),
                       processes_ > 1 ? fmt::format(" over {} processes", processes_) : "",
                       two_level_ ? fmt::format(" in two levels ({} node{} x {} GPU{})", nodes_, nodes_ == 1 ? "" : "s",
                                                node_gpus_, node_gpus_ == 1 ? "" : "s")
                                  : "",
                       sharing_.empty() ? "" : "; " + sharing_);
  }
  bool asynchronous() const override { return true; }

  void allreduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    if (two_level_) {
      two_level_average(bufs, off, count);
      return;
    }
    group([&](std::size_t i) {
      SB_NCCL(ncclAllReduce(bufs[i] + off, bufs[i] + off, count, ncclFloat, ncclAvg, comms_[i], streams_[i]));
    });
  }
  void reduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    group([&](std::size_t i) {
      SB_NCCL(ncclReduce(bufs[i] + off, bufs[i] + off, count, ncclFloat, ncclAvg, 0, comms_[i], streams_[i]));
    });
  }
  void broadcast(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    group([&](std::size_t i) {
      SB_NCCL(ncclBroadcast(bufs[i] + off, bufs[i] + off, count, ncclFloat, 0, comms_[i], streams_[i]));
    });
  }

  void check() override {
    std::vector<ncclComm_t> all = comms_;
    all.insert(all.end(), node_.begin(), node_.end());
    all.insert(all.end(), cross_.begin(), cross_.end());
    for (auto c : all) {
      if (!c) continue;
      ncclResult_t st = ncclSuccess;
      SB_NCCL(ncclCommGetAsyncError(c, &st));
      if (st != ncclSuccess && st != ncclInProgress) {
        const std::string why = fmt::format("{} ({})", ncclGetErrorString(st), ncclGetLastError(c));
        abort();
        throw SyncError(fmt::format("NCCL reported an asynchronous error during the gradient sync: {}", why));
      }
    }
  }
  // NCCL's abort can block (its proxy threads, a cudaFree behind a kernel that waits for a peer): it
  // runs on a thread of its own for at most kAbortWaitS, and the communicators are gone from here
  // either way, so the caller's error still comes.
  void abort() override {
    failed_ = true;
    std::vector<ncclComm_t> comms;
    for (auto* v : {&comms_, &node_, &cross_})
      for (auto& c : *v)
        if (c) comms.push_back(std::exchange(c, nullptr));
    if (comms.empty()) return;
    const int device = devices_.front();
    run_within(
        [comms, device] {
          cudaSetDevice(device);
          for (auto c : comms) ncclCommAbort(c);
        },
        kAbortWaitS);
  }
  static constexpr double kAbortWaitS = 10;

 private:
  // An initialisation call: ncclInProgress is how a non-blocking one says it goes on.
  static void init_call(ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress)
      throw_error(
          __FILE__, __LINE__,
          fmt::format("NCCL's initialisation failed: {} ({})", ncclGetErrorString(r), ncclGetLastError(nullptr)));
  }
  // Polls until every communicator is ready; SyncError (the caller's Comms abort them) after the
  // timeout or on an error.
  void wait_ready(const std::vector<ncclComm_t>& comms, const char* what) const {
    const auto waiting = group_.waiting();  // on the others: a peer's liveness ask does not name this one
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      bool pending = false;
      for (auto c : comms) {
        ncclResult_t st = ncclInProgress;  // a communicator not yet published by its job: pending
        if (c != nullptr) {
          const ncclResult_t q = ncclCommGetAsyncError(c, &st);
          if (q != ncclSuccess) st = q;  // the query itself failed: not "still in progress"
        }
        if (st == ncclInProgress) {
          pending = true;
        } else if (st != ncclSuccess) {
          throw SyncError(fmt::format("{} failed on process {} of {}: {} ({})", what, rank_, processes_,
                                      ncclGetErrorString(st), ncclGetLastError(c)));
        }
      }
      if (!pending) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (timeout_s_ > 0 && waited > timeout_s_) {
        const double window = std::clamp(timeout_s_ / 4, 2.0, 10.0);
        // the others time out about now too
        const std::string who = group_.silent_ranks(window, stalled_after(timeout_s_, window));
        throw SyncError(fmt::format(
            "{} did not complete within {:g} s on process {} of {}: {}. Raise --sync-timeout-s if NCCL is "
            "legitimately that slow to start (0 waits forever)",
            what, timeout_s_, rank_, processes_,
            who.empty() ? "every process answered, so NCCL itself stalled (NCCL_DEBUG=INFO says where)" : who));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // Per bucket, each step a group over this process's towers, in stream order: the average of the
  // node's GPUs reduce-scattered in place (GPU r of the node keeps share r of count / G), each share
  // averaged across the nodes, the node's shares all-gathered in place; the count % G floats left over
  // averaged over every GPU at once. ncclAvg at both reductions divides by G, then by the nodes.
  void two_level_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) {
    const auto g = static_cast<std::size_t>(node_gpus_);
    const std::size_t share = count / g, rest = count - share * g;
    const auto mine = [&](std::size_t i) { return bufs[i] + off + static_cast<std::size_t>(node_rank_[i]) * share; };
    if (share > 0) {  // (one GPU per node: nothing to scatter or gather)
      if (g > 1)
        group([&](std::size_t i) {
          SB_NCCL(ncclReduceScatter(bufs[i] + off, mine(i), share, ncclFloat, ncclAvg, node_[i], streams_[i]));
        });
      if (nodes_ > 1)
        group([&](std::size_t i) {
          SB_NCCL(ncclAllReduce(mine(i), mine(i), share, ncclFloat, ncclAvg, cross_[i], streams_[i]));
        });
      if (g > 1)
        group([&](std::size_t i) {
          SB_NCCL(ncclAllGather(mine(i), bufs[i] + off, share, ncclFloat, node_[i], streams_[i]));
        });
    }
    if (rest > 0)
      group([&](std::size_t i) {
        float* tail = bufs[i] + off + share * g;
        SB_NCCL(ncclAllReduce(tail, tail, rest, ncclFloat, ncclAvg, comms_[i], streams_[i]));
      });
  }
  template <class F>
  void group(F&& per_rank) {
    SB_CHECK(!failed_ && comms_.front() != nullptr, "the NCCL communicator was aborted after an earlier failure");
    try {
      NcclGroup g;
      for (std::size_t i = 0; i < comms_.size(); ++i) per_rank(i);
      g.end();
    } catch (...) {
      failed_ = true;
      throw;
    }
  }
  const ProcessGroup& group_;  // outlives the collective (TowerOptions::group)
  int processes_, rank_;
  double timeout_s_;
  std::string sharing_;
  bool two_level_;
  int node_gpus_ = 0, nodes_ = 0;  // two levels: the GPUs of a node, the nodes
  bool failed_ = false;
  std::vector<int> devices_;
  std::vector<cudaStream_t> streams_;
  std::vector<ncclComm_t> comms_;
  std::vector<ncclComm_t> node_, cross_;  // two levels: per tower, its node's and its share's across the nodes
  std::vector<int> node_rank_;            // two levels: per tower, its rank in its node's communicator
};

}  // namespace

int nccl_version() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

std::string nccl_version_string() {
  const int v = nccl_version();  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9
  return v ? fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100) : "(no library)";
}

std::unique_ptr<Collective> make_nccl_collective(const std::vector<Backend*>& towers,
                                                 const std::vector<Stream*>& streams, const ProcessGroup& group,
                                                 const NcclOptions& opt) {
  return std::make_unique<NcclCollective>(towers, streams, group, opt);
}

}  // namespace stepbench
