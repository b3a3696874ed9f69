// ProcessGroup's MPI transport (built with STEPBENCH_MPI): initialisation, the node split, and every
// collective non-blocking and polled, so that a stalled or dead peer ends the run with a message.
#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "comm/transport.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

// MPI counts are ints: large buffers go in chunks.
template <class T, class F>
void chunked(T* data, std::size_t count, F&& f) {
  constexpr std::size_t kMax = std::size_t{1} << 30;
  for (std::size_t off = 0; off < count; off += kMax) f(data + off, static_cast<int>(std::min(kMax, count - off)));
}

class MpiTransport final : public Transport {
 public:
  // comm: MPI_COMM_WORLD for the whole group (which finalises MPI when it goes), or a level's.
  explicit MpiTransport(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {}
  // Completes a non-blocking collective, or throws SyncError once the timeout has passed: a peer that
  // died or stalled must end the run with a message naming it, not hang it.
  void wait(const ProcessGroup& pg, MPI_Request& req, const char* op) {
    const std::string w = pg.level_name().empty() ? std::string(op) : fmt::format("{} {}", op, pg.level_name());
    const char* what = w.c_str();
    const double limit = pg.sync_timeout();
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (limit > 0 && waited > limit) {
        const double window = std::clamp(limit / 4, 2.0, 10.0);
        const std::string who = say_silence(pg, silent_peers(pg, window), window, stalled_after(limit, window));
        throw SyncError(fmt::format(
            "{} did not complete within {:g} s on process {} of {}: {}. If the step is legitimately that slow, raise "
            "--sync-timeout-s (0 waits forever)",
            what, limit, pg.world_rank(), pg.world_size(), who.empty() ? "another process failed or stalled" : who));
      }
    }
  }

  ~MpiTransport() override {
    int fin = 0;
    if (MPI_Finalized(&fin), fin) return;
    if (comm_ != MPI_COMM_WORLD)
      MPI_Comm_free(&comm_);
    else
      MPI_Finalize();
  }
  std::string name() const override { return "MPI"; }
  void abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }  // every process, whatever the level

  void allreduce_max(const ProcessGroup& pg, double* v, std::size_t n) override {
    chunked(v, n, [this, &pg](double* p, int k) {
      MPI_Request r;
      MPI_Iallreduce(MPI_IN_PLACE, p, k, MPI_DOUBLE, MPI_MAX, comm_, &r);
      wait(pg, r, "an all-reduce among the processes (MPI)");
    });
  }
  void allreduce_sum(const ProcessGroup& pg, float* data, std::size_t count) override {
    chunked(data, count, [this, &pg](float* p, int n) {
      MPI_Request r;
      MPI_Iallreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, comm_, &r);
      wait(pg, r, "the gradient all-reduce (MPI)");
    });
  }
  void reduce_sum_to(const ProcessGroup& pg, float* data, std::size_t count, int to) override {
    const bool root = pg.rank() == to;
    chunked(data, count, [this, &pg, root, to](float* p, int n) {
      MPI_Request r;
      MPI_Ireduce(root ? MPI_IN_PLACE : p, root ? p : nullptr, n, MPI_FLOAT, MPI_SUM, to, comm_, &r);
      wait(pg, r, to == 0 ? "the gradient reduce to the parameter server (MPI)" : "a gradient reduce (MPI)");
    });
  }
  void broadcast_bytes(const ProcessGroup& pg, void* data, std::size_t bytes, int from) override {
    chunked(static_cast<char*>(data), bytes, [this, &pg, from](char* p, int n) {
      MPI_Request r;
      MPI_Ibcast(p, n, MPI_BYTE, from, comm_, &r);
      wait(pg, r, from == 0 ? "a broadcast from process 0 (MPI)" : "a broadcast (MPI)");
    });
  }
  Silence silent_peers(const ProcessGroup& pg, double window_s) override {
    const int n = pg.size(), me = pg.rank();
    constexpr int kTag = 0x5342;  // a tag of its own
    std::vector<int> in(static_cast<std::size_t>(n), 0), out(static_cast<std::size_t>(n), 1);
    std::vector<MPI_Request> rx(static_cast<std::size_t>(n), MPI_REQUEST_NULL), tx = rx;
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const auto i = static_cast<std::size_t>(r);
      MPI_Irecv(&in[i], 1, MPI_INT, r, kTag, comm_, &rx[i]);
      MPI_Isend(&out[i], 1, MPI_INT, r, kTag, comm_, &tx[i]);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(window_s);
    Silence silent;
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      int done = 0;
      while (!done && std::chrono::steady_clock::now() < until)
        MPI_Test(&rx[static_cast<std::size_t>(r)], &done, MPI_STATUS_IGNORE);
      if (!done) silent.gone.push_back(r);  // its requests stay: MPI_Abort or MPI_Finalize ends them
    }
    return silent;
  }

 private:
  MPI_Comm comm_;
  void allgather_bytes(const ProcessGroup& pg, const void* mine, std::size_t bytes, void* all) override {
    SB_CHECK(bytes < (std::size_t{1} << 30), "an all-gather of at most 1 GiB per process");
    MPI_Request r;
    MPI_Iallgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE, comm_, &r);
    wait(pg, r, "an all-gather (MPI)");
  }
};

}  // namespace

bool built_with_mpi() { return true; }

Joined join_mpi(const LaunchEnv& env, double) {
  Joined j;
  int inited = 0;
  MPI_Initialized(&inited);
  int provided = MPI_THREAD_SERIALIZED;
  if (!inited)
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  else
    MPI_Query_thread(&provided);
  j.transport = std::make_unique<MpiTransport>();  // finalises MPI when the group goes
  j.threads_ok = provided >= MPI_THREAD_SERIALIZED;
  MPI_Comm_rank(MPI_COMM_WORLD, &j.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &j.size);
  MPI_Comm node;  // the processes that share this node's GPUs (or act as one node: --procs-per-node)
  if (env.nodes_given)
    MPI_Comm_split(MPI_COMM_WORLD, env.node, j.rank, &node);
  else
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, j.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &j.local_rank);
  MPI_Comm_size(node, &j.local_size);
  // which node, of how many: nodes numbered by their lowest rank
  int lowest = j.rank;
  MPI_Allreduce(&j.rank, &lowest, 1, MPI_INT, MPI_MIN, node);
  std::vector<int> lows(static_cast<std::size_t>(j.size)), pairs(2 * static_cast<std::size_t>(j.size));
  MPI_Allgather(&lowest, 1, MPI_INT, lows.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> firsts = lows;
  std::sort(firsts.begin(), firsts.end());
  firsts.erase(std::unique(firsts.begin(), firsts.end()), firsts.end());
  j.nodes = static_cast<int>(firsts.size());
  j.node = static_cast<int>(std::lower_bound(firsts.begin(), firsts.end(), lowest) - firsts.begin());
  const int mine[2] = {j.node, j.local_rank};
  MPI_Allgather(mine, 2, MPI_INT, pairs.data(), 2, MPI_INT, MPI_COMM_WORLD);
  int local_max = j.local_size;
  MPI_Allreduce(&j.local_size, &local_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  auto [within, across] = level_members(pairs, j.node, j.local_rank, j.nodes, local_max, j.levels_why);
  if (!within.empty() && j.local_size > 1 && j.nodes > 1) {  // the levels: this node, and this local rank's
    MPI_Comm out;
    MPI_Comm_split(MPI_COMM_WORLD, j.local_rank, j.node, &out);
    j.within = std::make_unique<MpiTransport>(node);
    j.across = std::make_unique<MpiTransport>(out);
    j.within_ranks = std::move(within);
    j.across_ranks = std::move(across);
  } else {  // the same answer on every process: none splits
    MPI_Comm_free(&node);
  }
  // every rank's host and process id, for messages and the straggler report
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::vector<char> hosts(sizeof host * static_cast<std::size_t>(j.size));
  std::vector<long> pids(static_cast<std::size_t>(j.size));
  const long pid = getpid();
  MPI_Allgather(host, sizeof host, MPI_CHAR, hosts.data(), sizeof host, MPI_CHAR, MPI_COMM_WORLD);
  MPI_Allgather(&pid, 1, MPI_LONG, pids.data(), 1, MPI_LONG, MPI_COMM_WORLD);
  for (int r = 0; r < j.size; ++r)
    j.peers.push_back(
        {std::string(hosts.data() + sizeof host * static_cast<std::size_t>(r)), pids[static_cast<std::size_t>(r)]});
  return j;
}

}  // namespace stepbench
