// The process group: rank 0 of 1 outside a launcher; under one, what MPI says (comm/mpi.hpp holds
// the MPI calls). Every collective is an identity for a single process.
#include "comm/process_group.hpp"

#include "comm/mpi.hpp"

namespace stepbench {

std::unique_ptr<ProcessGroup> ProcessGroup::create(bool under_launcher) {
  auto pg = std::make_unique<ProcessGroup>();
  if (!under_launcher) return pg;
  const mpi::World w = mpi::init();  // UsageError when stepbench was built without MPI
  pg->rank_ = w.rank;
  pg->size_ = w.size;
  pg->local_rank_ = w.local_rank;
  pg->local_size_ = w.local_size;
  pg->threads_ok_ = w.threads_ok;
  pg->mpi_ = true;  // and finalised by this group's destructor
  return pg;
}

ProcessGroup::~ProcessGroup() {
  if (mpi_) mpi::finalize();
}

void ProcessGroup::abort(int code) const {
  if (mpi_ && size_ > 1) mpi::abort(code);
}

double ProcessGroup::allreduce_max(double v) const {
  if (mpi_ && size_ > 1) mpi::allreduce_max(*this, v);
  return v;
}

void ProcessGroup::allreduce_sum(float* data, std::size_t count) const {
  if (mpi_ && size_ > 1) mpi::allreduce_sum(*this, data, count);
}

void ProcessGroup::reduce_sum_to_root(float* data, std::size_t count) const {
  if (mpi_ && size_ > 1) mpi::reduce_sum_to_root(*this, data, count);
}

void ProcessGroup::broadcast_from_root(float* data, std::size_t count) const {
  if (mpi_ && size_ > 1) mpi::broadcast_from_root(*this, data, count);
}

void ProcessGroup::broadcast_bytes_from_root(void* data, std::size_t bytes) const {
  if (mpi_ && size_ > 1) mpi::broadcast_bytes_from_root(*this, data, bytes);
}

}  // namespace stepbench
