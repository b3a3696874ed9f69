// What carries ProcessGroup's collectives between processes: MPI (comm/mpi.cpp) or Gloo over a store
// (comm/gloo_group.cpp). A transport exists only for a group of more than one process, or one that
// a launcher started. Every call waits at most pg.sync_timeout() seconds (0: forever) and throws
// SyncError naming pg's rank when a peer stalled or died. Internal to src/comm.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/launch_env.hpp"
#include "comm/process_group.hpp"

namespace stepbench {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;  // "MPI", "Gloo"
  // Ends the other processes too (MPI_Abort), or drops this one's connections so that they fail at once.
  virtual void abort(int code) = 0;
  virtual void allreduce_max(const ProcessGroup& pg, double* v, std::size_t n) = 0;
  virtual void allreduce_sum(const ProcessGroup& pg, float* data, std::size_t count) = 0;
  virtual void reduce_sum_to_root(const ProcessGroup& pg, float* data, std::size_t count) = 0;
  virtual void broadcast_bytes(const ProcessGroup& pg, void* data, std::size_t bytes) = 0;
  // Every rank's `bytes` bytes, in rank order, into all (size() x bytes).
  virtual void allgather_bytes(const ProcessGroup& pg, const void* mine, std::size_t bytes, void* all) = 0;
  // After a timeout: the ranks that did not answer a token within window_s (every rank that is still
  // well calls it about then). The group may be spent afterwards.
  virtual std::vector<int> silent_peers(const ProcessGroup& pg, double window_s) = 0;
};

// Where this process stands, as its transport found it.
struct Joined {
  std::unique_ptr<Transport> transport;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  bool threads_ok = true;  // the collectives may be called from a communication thread
  std::vector<PeerInfo> peers;
};

// MPI_Init (MPI_THREAD_SERIALIZED) and the node split; UsageError when built without MPI.
Joined join_mpi(double timeout_s);
// The store's rendezvous, then Gloo's full mesh over TCP; UsageError when built without Gloo.
Joined join_gloo(const LaunchEnv& env, double timeout_s);

}  // namespace stepbench
