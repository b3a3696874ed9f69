// The process group: one process per GPU (or per group of CPU towers) when launched by mpirun, as
// nccl-tests and Horovod run. Outside a launcher it is rank 0 of 1 and MPI is never initialised.
// The program owns one (the command line makes it) and hands it to whatever spans processes.
#pragma once
#include <atomic>
#include <cstddef>
#include <memory>

namespace stepbench {

class ProcessGroup {
 public:
  // This process alone: rank 0 of 1, MPI untouched.
  ProcessGroup() = default;
  // under_launcher: the caller saw a launcher's environment (mpirun, a PMI launcher). Initialises
  // MPI then; UsageError when stepbench was built without MPI.
  static std::unique_ptr<ProcessGroup> create(bool under_launcher);
  ~ProcessGroup();  // MPI_Finalize when this group initialised MPI
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the processes on this node (which GPUs it takes)
  int local_size() const { return local_size_; }
  bool threads_ok() const { return threads_ok_; }  // MPI may be called from a communication thread
  bool uses_mpi() const { return mpi_; }

  // Ends every process of the group (MPI_Abort) so that one failing rank does not leave the others
  // waiting in a collective; a no-op for a single process.
  void abort(int code) const;

  // Collectives over the group on host memory; identities for a single process. They poll
  // non-blocking MPI requests and throw SyncError when one has not completed within the timeout
  // (a stalled or dead peer), instead of waiting forever.
  double allreduce_max(double v) const;
  void allreduce_sum(float* data, std::size_t count) const;
  void reduce_sum_to_root(float* data, std::size_t count) const;
  void broadcast_from_root(float* data, std::size_t count) const;
  void broadcast_bytes_from_root(void* data, std::size_t bytes) const;  // e.g. NCCL's unique id
  // Seconds a collective may take (--sync-timeout-s); 0 waits forever. Default 600.
  void set_sync_timeout(double seconds) { timeout_s_ = seconds; }
  double sync_timeout() const { return timeout_s_.load(); }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool threads_ok_ = true;
  bool mpi_ = false;
  std::atomic<double> timeout_s_{600.0};
};

}  // namespace stepbench
