#include "comm/process_group.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>

#include "tensor/error.hpp"

#ifdef STEPBENCH_HAVE_MPI
#include <mpi.h>
#endif

namespace stepbench {
namespace {

#ifdef STEPBENCH_HAVE_MPI
// MPI counts are ints: large buffers go in chunks.
template <class T, class F>
void chunked(T* data, std::size_t count, F&& f) {
  constexpr std::size_t kMax = std::size_t{1} << 30;
  for (std::size_t off = 0; off < count; off += kMax) f(data + off, static_cast<int>(std::min(kMax, count - off)));
}

// Completes a non-blocking collective, or throws SyncError once the timeout has passed: a peer that
// died or stalled must end the run with a message, not hang it.
void wait(const ProcessGroup& pg, MPI_Request& req, const char* what) {
  const double limit = pg.sync_timeout();
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (limit > 0 && waited > limit)
      throw SyncError(fmt::format(
          "{} did not complete within {:g} s on process {} of {}: another process failed or stalled. If the step "
          "is legitimately that slow, raise --sync-timeout-s (0 waits forever)",
          what, limit, pg.rank(), pg.size()));
  }
}
#endif

}  // namespace

std::unique_ptr<ProcessGroup> ProcessGroup::create(bool under_launcher) {
  auto pg = std::make_unique<ProcessGroup>();
  if (!under_launcher) return pg;
#ifdef STEPBENCH_HAVE_MPI
  int inited = 0;
  MPI_Initialized(&inited);
  int provided = MPI_THREAD_SERIALIZED;
  if (!inited)
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  else
    MPI_Query_thread(&provided);
  pg->threads_ok_ = provided >= MPI_THREAD_SERIALIZED;
  MPI_Comm_rank(MPI_COMM_WORLD, &pg->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &pg->size_);
  MPI_Comm node;  // the processes that share this node's GPUs
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, pg->rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &pg->local_rank_);
  MPI_Comm_size(node, &pg->local_size_);
  MPI_Comm_free(&node);
  pg->mpi_ = true;  // and finalised by this group's destructor
#else
  throw UsageError("stepbench was launched by mpirun but built without MPI (configure with -DSTEPBENCH_MPI=ON)");
#endif
  return pg;
}

ProcessGroup::~ProcessGroup() {
#ifdef STEPBENCH_HAVE_MPI
  int fin = 0;
  if (mpi_ && (MPI_Finalized(&fin), !fin)) MPI_Finalize();
#endif
}

void ProcessGroup::abort(int code) const {
#ifdef STEPBENCH_HAVE_MPI
  if (mpi_ && size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  (void)code;
}

double ProcessGroup::allreduce_max(double v) const {
#ifdef STEPBENCH_HAVE_MPI
  if (mpi_ && size_ > 1) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &r);
    wait(*this, r, "an all-reduce of the timings");
  }
#endif
  return v;
}

void ProcessGroup::allreduce_sum(float* data, std::size_t count) const {
#ifdef STEPBENCH_HAVE_MPI
  if (!mpi_ || size_ < 2) return;
  chunked(data, count, [this](float* p, int n) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    wait(*this, r, "the gradient all-reduce (MPI)");
  });
#else
  (void)data, (void)count;
#endif
}

void ProcessGroup::reduce_sum_to_root(float* data, std::size_t count) const {
#ifdef STEPBENCH_HAVE_MPI
  if (!mpi_ || size_ < 2) return;
  const bool root = rank_ == 0;
  chunked(data, count, [this, root](float* p, int n) {
    MPI_Request r;
    MPI_Ireduce(root ? MPI_IN_PLACE : p, root ? p : nullptr, n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD, &r);
    wait(*this, r, "the gradient reduce to the parameter server (MPI)");
  });
#else
  (void)data, (void)count;
#endif
}

void ProcessGroup::broadcast_from_root(float* data, std::size_t count) const {
#ifdef STEPBENCH_HAVE_MPI
  if (!mpi_ || size_ < 2) return;
  chunked(data, count, [this](float* p, int n) {
    MPI_Request r;
    MPI_Ibcast(p, n, MPI_FLOAT, 0, MPI_COMM_WORLD, &r);
    wait(*this, r, "the parameter broadcast (MPI)");
  });
#else
  (void)data, (void)count;
#endif
}

void ProcessGroup::broadcast_bytes_from_root(void* data, std::size_t bytes) const {
#ifdef STEPBENCH_HAVE_MPI
  if (!mpi_ || size_ < 2) return;
  chunked(static_cast<char*>(data), bytes, [this](char* p, int n) {
    MPI_Request r;
    MPI_Ibcast(p, n, MPI_BYTE, 0, MPI_COMM_WORLD, &r);
    wait(*this, r, "a broadcast from process 0 (MPI)");
  });
#else
  (void)data, (void)bytes;
#endif
}

}  // namespace stepbench
