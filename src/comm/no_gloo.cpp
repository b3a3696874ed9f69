// Built without Gloo: processes started without MPI cannot meet; join_gloo refuses, saying so.
#include "comm/transport.hpp"
#include "tensor/error.hpp"

namespace stepbench {

bool built_with_gloo() { return false; }

Joined join_gloo(const LaunchEnv&, double, bool) {
  throw UsageError(
      "several processes without MPI (stepbench launch, torchrun, srun) need Gloo, and this stepbench was built "
      "without it: install Debian's libgloo-dev and rebuild, or launch with mpirun");
}

}  // namespace stepbench
