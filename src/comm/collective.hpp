// Moving gradient and parameter buckets between towers: the Collective interface, and the two
// implementations (host memory plus MPI for the cpu backend's towers, NCCL for GPU towers).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/process_group.hpp"

namespace stepbench {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual std::string name() const = 0;
  // true: the calls enqueue on the streams the collective was made with and return at once.
  virtual bool asynchronous() const { return false; }
  // Asynchronous ones: throws SyncError (after abort()) when the communicator reported an error.
  virtual void check() {}
  // Ends the communicator so that work waiting on it returns (a hung collective).
  virtual void abort() {}
  // Average `count` floats at offset `off` of every tower's buffer; result on every tower.
  virtual void allreduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) = 0;
  // Average onto tower 0 only.
  virtual void reduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) = 0;
  // Copy tower 0's range to every other tower.
  virtual void broadcast(const std::vector<float*>& bufs, std::size_t off, std::size_t count) = 0;
};

// Towers whose memory the host can address (the cpu backend): sums on tower 0's backend, then,
// across the processes of `group` (when it has more than one), with MPI on tower 0's buffer. Runs
// to completion on the calling thread.
std::unique_ptr<Collective> make_host_collective(Backend& tower0, int local_towers, const ProcessGroup& group);

// NCCL over the towers' GPUs, one rank per tower, its collectives enqueued on `streams` (one per
// tower, made by that tower's backend). Across the processes of `group` the towers of every process
// form one communicator: process 0 makes the unique id and broadcasts it over MPI, as nccl-tests
// does. In one process the communicators come from ncclCommInitAll. Throws UnsupportedError when
// stepbench was built without CUDA.
std::unique_ptr<Collective> make_nccl_collective(const std::vector<Backend*>& towers,
                                                 const std::vector<Stream*>& streams, const ProcessGroup& group);

}  // namespace stepbench
