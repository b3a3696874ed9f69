// ProcessGroup's MPI calls (built with STEPBENCH_MPI): initialisation, the node split, and every
// collective non-blocking and polled, so that a stalled or dead peer ends the run with a message.
#include "comm/mpi.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>

#include "tensor/error.hpp"

namespace stepbench::mpi {
namespace {

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

}  // namespace

World init() {
  World w;
  int inited = 0;
  MPI_Initialized(&inited);
  int provided = MPI_THREAD_SERIALIZED;
  if (!inited)
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  else
    MPI_Query_thread(&provided);
  w.threads_ok = provided >= MPI_THREAD_SERIALIZED;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  MPI_Comm node;  // the processes that share this node's GPUs
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &w.local_rank);
  MPI_Comm_size(node, &w.local_size);
  MPI_Comm_free(&node);
  return w;
}

void finalize() {
  int fin = 0;
  if (MPI_Finalized(&fin), !fin) MPI_Finalize();
}

void abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

void allreduce_max(const ProcessGroup& pg, double& v) {
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &r);
  wait(pg, r, "an all-reduce of the timings");
}

void allreduce_sum(const ProcessGroup& pg, float* data, std::size_t count) {
  chunked(data, count, [&pg](float* p, int n) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    wait(pg, r, "the gradient all-reduce (MPI)");
  });
}

void reduce_sum_to_root(const ProcessGroup& pg, float* data, std::size_t count) {
  const bool root = pg.rank() == 0;
  chunked(data, count, [&pg, root](float* p, int n) {
    MPI_Request r;
    MPI_Ireduce(root ? MPI_IN_PLACE : p, root ? p : nullptr, n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD, &r);
    wait(pg, r, "the gradient reduce to the parameter server (MPI)");
  });
}

void broadcast_from_root(const ProcessGroup& pg, float* data, std::size_t count) {
  chunked(data, count, [&pg](float* p, int n) {
    MPI_Request r;
    MPI_Ibcast(p, n, MPI_FLOAT, 0, MPI_COMM_WORLD, &r);
    wait(pg, r, "the parameter broadcast (MPI)");
  });
}

void broadcast_bytes_from_root(const ProcessGroup& pg, void* data, std::size_t bytes) {
  chunked(static_cast<char*>(data), bytes, [&pg](char* p, int n) {
    MPI_Request r;
    MPI_Ibcast(p, n, MPI_BYTE, 0, MPI_COMM_WORLD, &r);
    wait(pg, r, "a broadcast from process 0 (MPI)");
  });
}

}  // namespace stepbench::mpi
