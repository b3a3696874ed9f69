// The process group: one process per GPU (or per group of CPU towers) when a launcher started
// several, as nccl-tests, Horovod and torchrun run. Outside a launcher it is rank 0 of 1 and nothing
// is initialised. Under mpirun the processes meet through MPI; under stepbench launch, torchrun or
// srun (or mpirun without MPI built in) through a store and Gloo (comm/launch_env.hpp says which).
// The program owns one (the command line makes it) and hands it to whatever spans processes.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stepbench {

struct LaunchEnv;  // comm/launch_env.hpp
class Transport;   // comm/transport.hpp

// Where a rank runs (from the rendezvous; under MPI, gathered once at creation).
struct PeerInfo {
  std::string host;
  long pid = 0;
};

// How long outside the group's calls names a rank as stalled after a wait of limit_s failed: half of
// it (a rank that stalled the wait has been outside about that long); with no limit (0), the asks'
// window.
inline double stalled_after(double limit_s, double window_s) { return limit_s > 0 ? limit_s / 2 : window_s; }

class ProcessGroup {
 public:
  // This process alone: rank 0 of 1.
  ProcessGroup();
  // The group `env` describes: MPI when its rendezvous is "mpi", else the store and Gloo, meeting
  // within timeout_s (0: forever; --sync-timeout-s). A single process without a launcher gets the
  // plain group. UsageError when the processes' variables disagree or the transport was not built;
  // SyncError naming the ranks that never arrived.
  // point_to_point: also connect what send() and recv() use (Gloo only: --cross-replica-sync off).
  static std::unique_ptr<ProcessGroup> create(const LaunchEnv& env, double timeout_s, bool point_to_point = false);
  ~ProcessGroup();  // MPI_Finalize when this group initialised MPI
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the processes on this node (which GPUs it takes)
  int local_size() const { return local_size_; }
  int node() const { return node_; }  // this process's node, of nodes() (LaunchEnv::node)
  int nodes() const { return nodes_; }
  bool threads_ok() const { return threads_ok_; }  // collectives may be called from a communication thread
  bool uses_mpi() const { return mpi_; }
  // "MPI", "Gloo", or "" for a single process; and which launcher started it.
  std::string transport_name() const;
  std::string launcher_name() const { return launcher_; }
  const std::vector<PeerInfo>& peers() const { return peers_; }  // one per rank

  // Ends every process of the group (MPI_Abort; under Gloo this process's connections close, which
  // fails the others' next collective) so that one failing rank does not leave the others waiting;
  // a no-op for a single process. Under Gloo it does not wait for a call in flight on another
  // thread (which ends within its timeout, never with --sync-timeout-s 0, while the others' calls
  // fail at once).
  void abort(int code) const;

  // Collectives over the group on host memory; identities for a single process. They throw SyncError
  // when one has not completed within the timeout (a stalled or dead peer), instead of waiting forever.
  double allreduce_max(double v) const;
  void allreduce_max(std::vector<double>& v) const;  // element by element
  void allreduce_sum(float* data, std::size_t count) const;
  void reduce_sum_to_root(float* data, std::size_t count) const { reduce_sum_to(data, count, 0); }
  void reduce_sum_to(float* data, std::size_t count, int root) const;  // the sum on `root` alone
  void broadcast_from_root(float* data, std::size_t count) const { broadcast_from(data, count, 0); }
  void broadcast_from(float* data, std::size_t count, int root) const;
  void broadcast_bytes_from_root(void* data, std::size_t bytes) const;  // e.g. NCCL's unique id
  // Every rank's values, rank after rank (each rank gives the same count).
  std::vector<double> allgather(const std::vector<double>& mine) const;
  std::vector<std::string> allgather(const std::string& mine) const;
  // After a collective timed out on this process (NCCL's, whose peers the group cannot see): every
  // other rank is asked whether it is there, and those that did not answer within window_s, or that
  // answered from outside every call of the group for stalled_s or more (stalled in their own work:
  // stalled_after() in comm/transport.hpp), are named with what they did: "rank 1 (pid 7 on h) did
  // not answer within 2 s (stalled or ended)"; "" when every rank answered from a call or had left
  // one only briefly. The group may be spent afterwards (the run is ending). Under Gloo a thread of
  // each process answers at any time; under MPI every well rank must call it at about the same time.
  std::string silent_ranks(double window_s, double stalled_s) const;
  // While one lives this process counts as waiting in a call of the group (a GPU collective polled,
  // NCCL's start), so that a peer's silent_ranks does not name it.
  class Waiting {
   public:
    explicit Waiting(Transport* t);
    ~Waiting();
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    Transport* t_;
  };
  Waiting waiting() const { return Waiting(t_.get()); }
  // Point to point on a connection of its own (the group made with point_to_point): send waits until
  // `bytes` went to rank `to`; recv waits for them from any rank of `from` (within the timeout, or
  // forever until cancel_recv) and returns which sent them. `slot` tells messages apart. UsageError
  // where the group was not made for it (MPI, whose threads are serialised, or no point_to_point);
  // SyncError when a peer is gone or silent past the timeout (a receive from one rank also when that
  // rank's connection closes; one from several is not woken by one of them closing). cancel_recv ends
  // every recv waiting forever on other threads (each then returns -1) and says whether one was; one
  // not yet waiting is not ended.
  void send(int to, const void* data, std::size_t bytes, std::uint64_t slot) const;
  int recv(const std::vector<int>& from, void* data, std::size_t bytes, std::uint64_t slot, bool forever) const;
  bool cancel_recv() const;
  // "rank 1 (pid 4242 on node7)", "ranks 1 (pid ...), 3 (pid ...)"; "" for none.
  std::string name_ranks(const std::vector<int>& ranks) const;
  // The two levels of a group spread over nodes (--variable-update distributed_all_reduce): the
  // processes of this node (rank local_rank() of local_size() there) and those of every node that
  // share this process's local rank (rank node() of nodes() there). A level of one process is a
  // group of one. has_levels() is false where the processes do not fill whole, equal nodes
  // (levels_why() says how); the levels are then this process alone and the whole group.
  bool has_levels() const { return levels_why_.empty(); }
  const std::string& levels_why() const { return levels_why_; }
  const ProcessGroup& within_node() const;
  const ProcessGroup& across_nodes() const;
  // This process's rank in the whole group (a level's rank() is its rank in the level), and the
  // whole group's size: what messages name.
  int world_rank() const { return world_.empty() ? rank_ : world_[static_cast<std::size_t>(rank_)]; }
  int world_size() const { return world_size_ > 0 ? world_size_ : size_; }
  // For messages: "within node 1", "across the nodes"; "" for the whole group.
  const std::string& level_name() const { return level_name_; }
  // Seconds a collective may take (--sync-timeout-s); 0 waits forever. Default 600. Set on the whole
  // group, it holds for its levels too.
  void set_sync_timeout(double seconds);
  double sync_timeout() const { return timeout_s_.load(); }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, node_ = 0, nodes_ = 1;
  bool threads_ok_ = true;
  bool mpi_ = false;
  std::string launcher_;
  std::vector<PeerInfo> peers_;
  std::unique_ptr<Transport> t_;  // null for a single process
  std::atomic<double> timeout_s_{600.0};
  std::unique_ptr<ProcessGroup> within_, across_, alone_;  // the levels; alone_: this process, for a level of one
  std::string levels_why_;
  std::vector<int> world_;  // a level's members as ranks of the whole group (empty for the whole group)
  int world_size_ = 0;
  std::string level_name_;
  static std::unique_ptr<ProcessGroup> level(const ProcessGroup& whole, std::unique_ptr<Transport> t,
                                             const std::vector<int>& members, std::string name);
};

// What this build can carry between processes.
bool built_with_mpi();
bool built_with_gloo();

}  // namespace stepbench
