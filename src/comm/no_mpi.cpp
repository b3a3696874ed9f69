// Built without MPI: mpirun's processes meet through the store and Gloo instead (comm/launch_env.cpp
// asks for --rendezvous), so join_mpi is never reached with a rendezvous other than "mpi"; it refuses.
#include "comm/transport.hpp"
#include "tensor/error.hpp"

namespace stepbench {

bool built_with_mpi() { return false; }

Joined join_mpi(const LaunchEnv&, double) {
  throw UsageError(
      "stepbench was launched by mpirun but built without MPI (configure with -DSTEPBENCH_MPI=ON), or give "
      "--rendezvous file:PATH to meet through Gloo");
}

}  // namespace stepbench
