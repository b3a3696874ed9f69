// NCCL between GPU towers: one communicator rank per tower, collectives enqueued on each tower's
// communication stream, grouped so that one thread can drive several GPUs. In one process the
// communicators come from ncclCommInitAll; under mpirun process 0 makes the unique id and MPI
// broadcasts it, then every process initialises its towers' ranks in one group (nccl-tests' way).
// Multi-GPU runs have not happened yet (the one GPU machine had one GPU); the GPU tests run it
// wherever two or more GPUs are visible.
#include <cuda_runtime.h>
#include <nccl.h>

#include <utility>
#include <vector>

#include "backend/cuda/check.hpp"
#include "comm/collective.hpp"

namespace stepbench {
namespace {

class NcclCollective final : public Collective {
 public:
  NcclCollective(const std::vector<Backend*>& towers, const std::vector<Stream*>& streams, const ProcessGroup& group)
      : processes_(group.size()) {
    const int rank = group.rank(), processes = group.size();
    SB_CHECK(!towers.empty() && towers.size() == streams.size(), "one stream per tower");
    for (std::size_t i = 0; i < towers.size(); ++i) {
      devices_.push_back(towers[i]->device());
      SB_CHECK(devices_.back() >= 0, "NCCL needs towers on the cuda backend");
      streams_.push_back(static_cast<cudaStream_t>(streams[i]->native_handle()));
    }
    const int local = static_cast<int>(devices_.size());
    comms_.resize(devices_.size());
    if (processes == 1) {
      SB_NCCL(ncclCommInitAll(comms_.data(), local, devices_.data()));
    } else {
      ncclUniqueId id{};
      if (rank == 0) SB_NCCL(ncclGetUniqueId(&id));
      group.broadcast_bytes_from_root(&id, sizeof id);
      SB_NCCL(ncclGroupStart());
      for (int i = 0; i < local; ++i) {
        SB_CUDA(cudaSetDevice(devices_[static_cast<std::size_t>(i)]));
        SB_NCCL(ncclCommInitRank(&comms_[static_cast<std::size_t>(i)], local * processes, id, rank * local + i));
      }
      SB_NCCL(ncclGroupEnd());
    }
  }
  ~NcclCollective() override {
    for (auto c : comms_)
      if (c) ncclCommDestroy(c);
  }

  std::string name() const override {
    return fmt::format("NCCL {}.{}.{}, {} ranks{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
                       comms_.size() * static_cast<std::size_t>(processes_),
                       processes_ > 1 ? fmt::format(" over {} processes (unique id over MPI)", processes_) : "");
  }
  bool asynchronous() const override { return true; }

  void allreduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    group([&](std::size_t i) {
      SB_NCCL(ncclAllReduce(bufs[i] + off, bufs[i] + off, count, ncclFloat, ncclAvg, comms_[i], streams_[i]));
    });
  }
  void reduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    group([&](std::size_t i) {
      SB_NCCL(ncclReduce(bufs[i] + off, bufs[i] + off, count, ncclFloat, ncclAvg, 0, comms_[i], streams_[i]));
    });
  }
  void broadcast(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    group([&](std::size_t i) {
      SB_NCCL(ncclBroadcast(bufs[i] + off, bufs[i] + off, count, ncclFloat, 0, comms_[i], streams_[i]));
    });
  }

  void check() override {
    for (auto c : comms_) {
      if (!c) continue;
      ncclResult_t st = ncclSuccess;
      SB_NCCL(ncclCommGetAsyncError(c, &st));
      if (st != ncclSuccess && st != ncclInProgress) {
        const std::string why = fmt::format("{} ({})", ncclGetErrorString(st), ncclGetLastError(c));
        abort();
        throw SyncError(fmt::format("NCCL reported an asynchronous error during the gradient sync: {}", why));
      }
    }
  }
  void abort() override {
    for (auto& c : comms_)
      if (c) ncclCommAbort(std::exchange(c, nullptr));
  }

 private:
  template <class F>
  void group(F&& per_rank) {
    SB_CHECK(comms_.front() != nullptr, "the NCCL communicator was aborted after an earlier failure");
    SB_NCCL(ncclGroupStart());
    for (std::size_t i = 0; i < comms_.size(); ++i) per_rank(i);
    SB_NCCL(ncclGroupEnd());
  }
  int processes_;
  std::vector<int> devices_;
  std::vector<cudaStream_t> streams_;
  std::vector<ncclComm_t> comms_;
};

}  // namespace

std::unique_ptr<Collective> make_nccl_collective(const std::vector<Backend*>& towers,
                                                 const std::vector<Stream*>& streams, const ProcessGroup& group) {
  return std::make_unique<NcclCollective>(towers, streams, group);
}

}  // namespace stepbench
