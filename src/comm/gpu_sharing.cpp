// nccl_gpu_sharing: what NCCL needs in the environment for ranks that share a GPU (collective.hpp).
#include <fmt/format.h>

#include "comm/collective.hpp"

namespace stepbench {

GpuSharing nccl_gpu_sharing(int version, int ranks_per_gpu, int towers_per_process, int processes, int rank,
                            const std::string& host, bool one_host) {
  GpuSharing s;
  if (towers_per_process * processes < 2) return s;
  s.env.push_back({"NCCL_RUNTIME_CONNECT", "0", false});
  if (ranks_per_gpu < 2) return s;
  const std::string lib =
      version ? fmt::format("NCCL {}.{}.{}", version / 10000, version / 100 % 100, version % 100) : "NCCL";
  if (version >= 23000) {
    s.env.push_back({"NCCL_MULTI_RANK_GPU_ENABLE", "1", false});
    s.env.push_back({"NCCL_NVLS_ENABLE", "0", false});
    s.env.push_back({"NCCL_MAX_CTAS", "8", false});
    s.how = fmt::format("{} ranks share each GPU ({} with NCCL_MULTI_RANK_GPU_ENABLE=1): not scaling figures",
                        ranks_per_gpu, lib);
  } else if (towers_per_process > 1) {
    s.refused = true;
    s.how = fmt::format(
        "{} towers of one process would share a GPU, which {} refuses before 2.30 (\"Duplicate GPU detected\"): run "
        "one tower per process, stepbench launch --nproc {} -- --gpus 1 ...",
        towers_per_process, lib, towers_per_process * processes);
  } else {
    s.env.push_back({"NCCL_HOSTID", fmt::format("{}-stepbench-rank{}", host, rank), true});
    s.env.push_back({"NCCL_NET", "Socket", false});
    // on one host the sockets take loopback: NCCL's default skips lo for any other interface, and a
    // machine without a network may have one up without an address that connects
    if (one_host) s.env.push_back({"NCCL_SOCKET_IFNAME", "lo", false});
    s.how = fmt::format(
        "{} ranks share each GPU ({}: a host id per process, the ranks talk over sockets): not "
        "scaling figures",
        ranks_per_gpu, lib);
  }
  return s;
}

}  // namespace stepbench
