// Built without MPI: no process group spans processes, so only init() is ever reached, and it
// refuses.
#include "comm/mpi.hpp"
#include "tensor/error.hpp"

namespace stepbench::mpi {

World init() {
  throw UsageError("stepbench was launched by mpirun but built without MPI (configure with -DSTEPBENCH_MPI=ON)");
}
void finalize() {}
void abort(int) {}
void allreduce_max(const ProcessGroup&, double&) {}
void allreduce_sum(const ProcessGroup&, float*, std::size_t) {}
void reduce_sum_to_root(const ProcessGroup&, float*, std::size_t) {}
void broadcast_from_root(const ProcessGroup&, float*, std::size_t) {}
void broadcast_bytes_from_root(const ProcessGroup&, void*, std::size_t) {}

}  // namespace stepbench::mpi
