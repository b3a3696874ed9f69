#include "stepbench/process_group.hpp"

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

#ifdef STEPBENCH_HAVE_MPI
// MPI counts are ints: large buffers go in chunks.
template <class F>
void chunked(float* data, std::size_t count, F&& f) {
  constexpr std::size_t kMax = std::size_t{1} << 30;
  for (std::size_t off = 0; off < count; off += kMax) f(data + off, static_cast<int>(std::min(kMax, count - off)));
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

double allreduce_max(double v) {
#ifdef STEPBENCH_HAVE_MPI
  if (g_mpi && process_group().size > 1) MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
#endif
  return v;
}

void allreduce_sum(float* data, std::size_t count) {
#ifdef STEPBENCH_HAVE_MPI
  if (!g_mpi || process_group().size < 2) return;
  chunked(data, count, [](float* p, int n) { MPI_Allreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
#else
  (void)data, (void)count;
#endif
}

void reduce_sum_to_root(float* data, std::size_t count) {
#ifdef STEPBENCH_HAVE_MPI
  if (!g_mpi || process_group().size < 2) return;
  const bool root = process_group().rank == 0;
  chunked(data, count, [root](float* p, int n) {
    MPI_Reduce(root ? MPI_IN_PLACE : p, root ? p : nullptr, n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  });
#else
  (void)data, (void)count;
#endif
}

void broadcast_from_root(float* data, std::size_t count) {
#ifdef STEPBENCH_HAVE_MPI
  if (!g_mpi || process_group().size < 2) return;
  chunked(data, count, [](float* p, int n) { MPI_Bcast(p, n, MPI_FLOAT, 0, MPI_COMM_WORLD); });
#else
  (void)data, (void)count;
#endif
}

}  // namespace stepbench
