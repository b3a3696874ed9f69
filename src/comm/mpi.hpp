// The MPI calls behind ProcessGroup: mpi.cpp when stepbench is built with MPI (STEPBENCH_MPI),
// no_mpi.cpp otherwise. ProcessGroup calls the collectives only when it initialised MPI and spans
// more than one process. Internal to src/comm.
#pragma once
#include <cstddef>

#include "comm/process_group.hpp"

namespace stepbench::mpi {

// Where this process stands in MPI_COMM_WORLD and among the processes of its node.
struct World {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  bool threads_ok = true;  // MPI_THREAD_SERIALIZED: MPI may be called from a communication thread
};

// Initialises MPI (asking for MPI_THREAD_SERIALIZED) unless it already is. UsageError when
// stepbench was built without MPI.
World init();
void finalize();  // MPI_Finalize, unless MPI is finalised already
void abort(int code);

// Non-blocking collectives over MPI_COMM_WORLD, polled until done; SyncError naming `pg`'s rank when
// one has not completed within pg.sync_timeout() (a stalled or dead peer).
void allreduce_max(const ProcessGroup& pg, double& v);
void allreduce_sum(const ProcessGroup& pg, float* data, std::size_t count);
void reduce_sum_to_root(const ProcessGroup& pg, float* data, std::size_t count);
void broadcast_from_root(const ProcessGroup& pg, float* data, std::size_t count);
void broadcast_bytes_from_root(const ProcessGroup& pg, void* data, std::size_t bytes);

}  // namespace stepbench::mpi
