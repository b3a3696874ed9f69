// What carries ProcessGroup's collectives between processes: MPI (comm/mpi.cpp) or Gloo over a store
// (comm/gloo_group.cpp). A transport exists only for a group of more than one process, or one that
// a launcher started. Every call waits at most pg.sync_timeout() seconds (0: forever) and throws
// SyncError naming pg's rank when a peer stalled or died. Internal to src/comm.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/launch_env.hpp"
#include "comm/process_group.hpp"

namespace stepbench {

// What a liveness ask found: the ranks that sent nothing back within the window (stalled or ended),
// and those that answered while outside every call of the group, with for how many seconds (stalled
// in their own work: a well rank is waiting in the call, or failed in it too).
struct Silence {
  std::vector<int> gone;
  std::vector<std::pair<int, double>> idle;
  bool empty() const { return gone.empty() && idle.empty(); }
};
// "rank 1 (pid 7 on h) did not answer within 2 s (stalled or ended)", and the ones idle for stalled_s
// or more; "" for none. A well rank between two calls (its own compute, or not yet in the next call
// when a peer dropped) answers idle too, briefly: only a rank outside the calls for about as long as
// the wait that failed explains it.
std::string say_silence(const ProcessGroup& pg, const Silence& s, double window_s, double stalled_s);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;  // "MPI", "Gloo"
  // Ends the other processes too (MPI_Abort), or drops this one's connections so that they fail at once
  // (without waiting for a call in flight on another thread, which fails then too).
  virtual void abort(int code) = 0;
  virtual void allreduce_max(const ProcessGroup& pg, double* v, std::size_t n) = 0;
  virtual void allreduce_sum(const ProcessGroup& pg, float* data, std::size_t count) = 0;
  virtual void reduce_sum_to(const ProcessGroup& pg, float* data, std::size_t count, int root) = 0;
  virtual void broadcast_bytes(const ProcessGroup& pg, void* data, std::size_t bytes, int root) = 0;
  // Every rank's `bytes` bytes, in rank order, into all (size() x bytes).
  virtual void allgather_bytes(const ProcessGroup& pg, const void* mine, std::size_t bytes, void* all) = 0;
  // After a failure: who did not answer an ask within window_s (MPI: every rank that is still well
  // calls it about then; Gloo: a thread of every process answers at any time). The group may be spent
  // afterwards, and this process counts as failed in it.
  virtual Silence silent_peers(const ProcessGroup& pg, double window_s) = 0;
  // +1 / -1 around a wait on the group outside the transport's calls (ProcessGroup::Waiting).
  virtual void waiting(int delta) { (void)delta; }
  // Point to point, on a connection of its own (a group made with point_to_point; ProcessGroup::send).
  virtual void send(const ProcessGroup& pg, int to, const void* data, std::size_t bytes, std::uint64_t slot);
  virtual int recv(const ProcessGroup& pg, const std::vector<int>& from, void* data, std::size_t bytes,
                   std::uint64_t slot, bool forever);
  virtual bool cancel_recv() { return false; }  // true: a recv was waiting, and now returns -1
};

// Where this process stands, as its transport found it.
struct Joined {
  std::unique_ptr<Transport> transport;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  int node = 0, nodes = 1;  // Gloo: the launcher's (LaunchEnv); MPI: its shared-memory split
  bool threads_ok = true;   // the collectives may be called from a communication thread
  std::vector<PeerInfo> peers;
  // The two levels (ProcessGroup::within_node, across_nodes), made when the processes fill several
  // nodes of more than one process each: the transports and their members' ranks in the whole
  // group, in the level's rank order. Otherwise null, and `levels_why` may say why not.
  std::unique_ptr<Transport> within, across;
  std::vector<int> within_ranks, across_ranks;
  std::string levels_why;
};

// The members of this process's two levels from every rank's (node, local rank), rank after rank:
// {within its node in local-rank order, across nodes with its local rank in node order}. Empty with
// `why` set when they do not form whole, equal nodes (a pair given twice, a node short of processes).
std::pair<std::vector<int>, std::vector<int>> level_members(const std::vector<int>& node_local_pairs, int node,
                                                            int local_rank, int nodes, int local_size,
                                                            std::string& why);

// Across hosts each host is a node: where the peers (rank order, from the rendezvous) run on more than
// one host and --procs-per-node did not pose nodes (env.nodes_given), env's node is its host's place
// among the hosts in the order of their first rank, its local rank its place among that host's ranks,
// nodes the hosts and local_size this host's ranks (hosts holding different numbers of processes
// then have no two levels: level_members says why). Returns whether the peers span several hosts.
bool place_by_host(const std::vector<PeerInfo>& peers, LaunchEnv& env);

// The store's rendezvous, then Gloo's full mesh over TCP (and the point-to-point mesh when asked);
// UsageError when built without Gloo.
Joined join_gloo(const LaunchEnv& env, double timeout_s, bool point_to_point);
// MPI_Init (MPI_THREAD_SERIALIZED) and the node split (shared memory, or env's when nodes_given);
// UsageError when built without MPI.
Joined join_mpi(const LaunchEnv& env, double timeout_s);

}  // namespace stepbench
