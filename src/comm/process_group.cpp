#include "stepbench/process_group.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>

#include "stepbench/error.hpp"

#ifdef STEPBENCH_HAVE_MPI
#include <mpi.h>
#endif

namespace stepbench {
namespace {

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

bool g_mpi = false;
std::atomic<double> g_timeout_s{600.0};

#ifdef STEPBENCH_HAVE_MPI
// MPI counts are ints: large buffers go in chunks.
template <class T, class F>
void chunked(T* data, std::size_t count, F&& f) {
  constexpr std::size_t kMax = std::size_t{1} << 30;
  for (std::size_t off = 0; off < count; off += kMax) f(data + off, static_cast<int>(std::min(kMax, count - off)));
}

// Completes a non-blocking collective, or throws SyncError once the timeout has passed: a peer that
// died or stalled must end the run with a message, not hang it.
void wait(MPI_Request& req, const char* what) {
  const double limit = g_timeout_s.load();
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
          what, limit, process_group().rank, process_group().size));
  }
}
#endif

}  // namespace

const ProcessGroup& process_group() {
  static const ProcessGroup g = [] {
    ProcessGroup pg;
    if (!launched_by_mpirun()) return pg;
#ifdef STEPBENCH_HAVE_MPI
    int inited = 0;
    MPI_Initialized(&inited);
    int provided = MPI_THREAD_SERIALIZED;
    if (!inited) MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    else MPI_Query_thread(&provided);
    pg.threads_ok = provided >= MPI_THREAD_SERIALIZED;
    g_mpi = true;
    std::atexit(process_group_finalize);  // also for programs that never call it (the tests)
    MPI_Comm_rank(MPI_COMM_WORLD, &pg.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &pg.size);
    MPI_Comm node;  // the processes that share this node's GPUs
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, pg.rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &pg.local_rank);
    MPI_Comm_size(node, &pg.local_size);
    MPI_Comm_free(&node);
#else
    throw UsageError("stepbench was launched by mpirun but built without MPI (configure with -DSTEPBENCH_MPI=ON)");
#endif
    return pg;
  }();
  return g;
}

void process_group_finalize() {
#ifdef STEPBENCH_HAVE_MPI
  int fin = 0;
  if (g_mpi && (MPI_Finalized(&fin), !fin)) MPI_Finalize();
#endif
}

void process_group_abort(int code) {
#ifdef STEPBENCH_HAVE_MPI
  if (g_mpi && process_group().size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  (void)code;
}

void set_sync_timeout(double seconds) { g_timeout_s = seconds; }
double sync_timeout() { return g_timeout_s.load(); }

double allreduce_max(double v) {
#ifdef STEPBENCH_HAVE_MPI
  if (g_mpi && process_group().size > 1) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &r);
    wait(r, "an all-reduce of the timings");
  }
#endif
  return v;
}

void allreduce_sum(float* data, std::size_t count) {
#ifdef STEPBENCH_HAVE_MPI
  if (!g_mpi || process_group().size < 2) return;
  chunked(data, count, [](float* p, int n) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    wait(r, "the gradient all-reduce (MPI)");
  });
#else
  (void)data, (void)count;
#endif
}

void reduce_sum_to_root(float* data, std::size_t count) {
#ifdef STEPBENCH_HAVE_MPI
  if (!g_mpi || process_group().size < 2) return;
  const bool root = process_group().rank == 0;
  chunked(data, count, [root](float* p, int n) {
    MPI_Request r;
    MPI_Ireduce(root ? MPI_IN_PLACE : p, root ? p : nullptr, n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD, &r);
    wait(r, "the gradient reduce to the parameter server (MPI)");
  });
#else
  (void)data, (void)count;
#endif
}

void broadcast_from_root(float* data, std::size_t count) {
#ifdef STEPBENCH_HAVE_MPI
  if (!g_mpi || process_group().size < 2) return;
  chunked(data, count, [](float* p, int n) {
    MPI_Request r;
    MPI_Ibcast(p, n, MPI_FLOAT, 0, MPI_COMM_WORLD, &r);
    wait(r, "the parameter broadcast (MPI)");
  });
#else
  (void)data, (void)count;
#endif
}

void broadcast_bytes_from_root(void* data, std::size_t bytes) {
#ifdef STEPBENCH_HAVE_MPI
  if (!g_mpi || process_group().size < 2) return;
  chunked(static_cast<char*>(data), bytes, [](char* p, int n) {
    MPI_Request r;
    MPI_Ibcast(p, n, MPI_BYTE, 0, MPI_COMM_WORLD, &r);
    wait(r, "a broadcast from process 0 (MPI)");
  });
#else
  (void)data, (void)bytes;
#endif
}

}  // namespace stepbench
