// The process group: one process per GPU (or per group of CPU towers) when launched by mpirun, as
// nccl-tests and Horovod run. Outside mpirun it is rank 0 of 1 and MPI is never initialised.
#pragma once
#include <cstddef>

namespace stepbench {

struct ProcessGroup {
  int rank = 0;
  int size = 1;
  bool threads_ok = true;  // MPI may be called from a communication thread (MPI_THREAD_SERIALIZED)
  int local_rank = 0;      // among the processes on this node (which GPUs this process takes)
  int local_size = 1;
};

// Initialises MPI on first use when launched by mpirun (Open MPI's or a PMI launcher's
// environment) and stepbench was built with MPI; otherwise rank 0 of 1.
const ProcessGroup& process_group();
// MPI_Finalize if MPI was initialised; call once at exit.
void process_group_finalize();
// Ends every process of the group (MPI_Abort) so that one failing rank does not leave the others
// waiting in a collective; a no-op for a single process.
void process_group_abort(int code);

// Collectives over the process group on host memory; identities for a single process. They poll
// non-blocking MPI requests and throw SyncError when one has not completed within the timeout
// (a stalled or dead peer), instead of waiting forever.
double allreduce_max(double v);
void allreduce_sum(float* data, std::size_t count);
void reduce_sum_to_root(float* data, std::size_t count);
void broadcast_from_root(float* data, std::size_t count);
void broadcast_bytes_from_root(void* data, std::size_t bytes);  // e.g. NCCL's unique id
// Seconds a collective may take (--sync-timeout-s); 0 waits forever. Default 600.
void set_sync_timeout(double seconds);
double sync_timeout();

}  // namespace stepbench
