// Built without CUDA: no NCCL.
#include "comm/collective.hpp"
#include "tensor/error.hpp"

namespace stepbench {

std::unique_ptr<Collective> make_nccl_collective(const std::vector<Backend*>&, const std::vector<Stream*>&,
                                                 const ProcessGroup&, const NcclOptions&) {
  throw UnsupportedError(
      "NCCL needs the cuda backend: stepbench was built without CUDA (configure with -DSTEPBENCH_CUDA=ON)");
}

int nccl_version() { return 0; }
std::string nccl_version_string() { return "(not built)"; }

}  // namespace stepbench
