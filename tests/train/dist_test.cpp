// Towers across processes, run under any launcher (ctest: mpi.two_processes under mpirun; dist.launch
// under stepbench launch; dist.*_by_hand with torchrun's, a file rendezvous's and srun's variables;
// scripts/gpu-check.sh ranks on a GPU). Without a launcher every test here skips.
//   Dist.TwoProcessesEqualTwoTowersInOneProcess  cpu: one tower per process ends the steps bit for
//       bit where two towers in one process do, in every variable-update mode
//   Dist.TwoLevelsEqualReplicated  cpu: distributed_all_reduce over any number of processes and nodes
//       (dist.two_nodes, mpi.two_nodes: 4 processes posing as 2 nodes) ends where replicated and where as many towers
//       in one process do, to the rounding of the order of summation, with every rank bit for bit alike;
//       distributed_replicated with one parameter server and with one per node where parameter_server does
//   Dist.AsynchronousServerAppliesEveryPushOnce  cpu, Gloo: --cross-replica-sync off, each process
//       stepping at its own pace: the server applies every worker's gradient exactly once (count and sum)
//   Dist.AsynchronousShardedServersApplyEveryPushOnce  cpu, Gloo, 2 nodes or more: distributed_replicated
//       asynchronous, each node a worker at its own pace, one server and one per node: every server
//       applies each node's shard once, and every process holds the shards it was sent
//   Dist.NcclRanksEqualTheOracle  cuda: one tower per process (several sharing a GPU when there are
//       fewer GPUs than processes), NCCL between them, in every mode, overlap on and off, fp32 and
//       bf16, launched and replayed from a CUDA Graph: every rank ends with the same parameters, within
//       the error model of the steps in double on the whole batch; distributed_all_reduce too, over
//       communicators split by node (gpu-check.sh ranks: 4 ranks as 2 nodes, and as one)
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "comm/collective.hpp"
#include "comm/launch_env.hpp"
#include "comm/process_group.hpp"
#include "support/chain_oracle.hpp"
#include "support/test_util.hpp"
#include "train/towers.hpp"

namespace stepbench {
namespace {

// The process group of this test program: whatever launched it (comm/launch_env.hpp).
// STEPBENCH_TEST_PROCS_PER_NODE=K: K consecutive ranks act as one node (stepbench's --procs-per-node).
ProcessGroup& test_group() {
  static const std::unique_ptr<ProcessGroup> g = [] {
    LaunchEnv env = discover_launch([](const char* v) { return std::getenv(v); }, "", built_with_mpi());
    if (const char* k = std::getenv("STEPBENCH_TEST_PROCS_PER_NODE")) split_nodes(env, std::atoi(k));
    return ProcessGroup::create(env, 120, /*point_to_point=*/true);
  }();
  return *g;
}

// Under ctest's launchers STEPBENCH_TEST_RANKS says how many processes were started: a discovery
// that fell back to one process must fail there, not skip every test as if no launcher ran.
void expect_the_launched_ranks(const ProcessGroup& pg) {
  const char* want = std::getenv("STEPBENCH_TEST_RANKS");
  if (want && *want) {
    ASSERT_EQ(pg.size(), std::atoi(want)) << "started as " << want << " processes, but this one found a group of "
                                          << pg.size() << ": the launcher's variables were not read";
  }
}

TowerOptions tiny_dist(BackendKind backend, int towers, VariableUpdate mode, bool on_host) {
  TowerOptions o;
  o.backend = backend;
  o.towers = towers;
  o.batch_per_tower = 4;
  o.model = ModelKind::tiny;
  o.model_options.image_size = 24;
  o.model_options.num_classes = 10;
  o.model_options.dropout = 0;
  o.variable_update = mode;
  o.ps_on_host = on_host;
  o.bucket_bytes = 8192;  // many buckets: several syncs during backward
  return o;
}

std::vector<float> tower_params(const Towers& t, int i) {
  std::vector<float> v(t.graph(i).param_arena_floats());
  t.backend(i).copy(t.stream(i), v.data(), t.graph(i).param_arena(), v.size() * sizeof(float));
  t.backend(i).synchronize(t.stream(i));
  return v;
}

struct DistMode {
  VariableUpdate update;
  bool on_host;  // --ps-device cpu
  std::string name() const { return fmt::format("{}{}", to_string(update), on_host ? " on the host" : ""); }
};
const DistMode kModes[] = {{VariableUpdate::replicated, false},
                           {VariableUpdate::parameter_server, false},
                           {VariableUpdate::parameter_server, true}};

TEST(Dist, TwoProcessesEqualTwoTowersInOneProcess) {
  const auto& pg = test_group();
  expect_the_launched_ranks(pg);
  if (pg.size() != 2) GTEST_SKIP() << "run under a launcher with 2 processes (ctest: mpi.two_processes, dist.*)";
  for (const DistMode& m : kModes) {
    SCOPED_TRACE(m.name());
    auto dio = tiny_dist(BackendKind::cpu, 1, m.update, m.on_host);
    dio.group = &test_group();
    Towers dist(dio);
    Towers local(tiny_dist(BackendKind::cpu, 2, m.update, m.on_host));
    EXPECT_EQ(dist.global_size(), 2);
    EXPECT_EQ(dist.sync_bytes(), local.sync_bytes());
    dist.set_synthetic_batch(77);  // process r gets the batch of tower r
    local.set_synthetic_batch(77);
    for (int k = 0; k < 2; ++k) {
      dist.step();
      local.step();
    }
    dist.synchronize();
    local.synchronize();
    EXPECT_EQ(tower_params(dist, 0), tower_params(local, pg.rank()));
    EXPECT_EQ(tower_params(local, 0), tower_params(local, 1));
  }
}

// Every rank's parameters bit for bit: each rank's checksum words, gathered and compared.
bool every_rank_holds(const ProcessGroup& pg, const std::vector<float>& p) {
  std::uint64_t h = 1469598103934665603ull;
  for (float x : p) {
    std::uint32_t b;
    std::memcpy(&b, &x, 4);
    h = (h ^ b) * 1099511628211ull;
  }
  const auto all = pg.allgather(std::vector<double>{static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffff)});
  for (std::size_t r = 2; r < all.size(); r += 2)
    if (all[r] != all[0] || all[r + 1] != all[1]) return false;
  return true;
}

// The mean of this process's towers' gradients at their first variables `init`, and the mean of their
// absolute values: from towers of its own (in one process, nothing synced) fed the batches that
// set_synthetic_batch(seed) gives the process's towers (the batch of global tower r x towers + i is
// tower i's here with the seed moved by as much).
std::vector<double> own_mean_gradient(TowerOptions o, int rank, std::uint64_t seed, const std::vector<float>& init) {
  o.group = nullptr;
  o.variable_update = VariableUpdate::independent;
  o.cross_replica_sync = true;
  o.async_checks = false;
  o.ps_ranks = 1;
  Towers ref(o);
  ref.set_synthetic_batch(seed + 7919 * static_cast<std::uint64_t>(rank * o.towers));
  EXPECT_EQ(tower_params(ref, 0), init) << "towers of a process's own start elsewhere";
  ref.forward_train();
  ref.backward();
  ref.synchronize();
  std::vector<double> mean(2 * init.size(), 0.0);
  for (int i = 0; i < o.towers; ++i) {
    std::vector<float> g(init.size());
    ref.backend(i).copy(ref.stream(i), g.data(), ref.graph(i).grad_arena(), g.size() * sizeof(float));
    ref.backend(i).synchronize(ref.stream(i));
    for (std::size_t j = 0; j < g.size(); ++j) {
      mean[j] += static_cast<double>(g[j]) / o.towers;
      mean[init.size() + j] += std::abs(static_cast<double>(g[j])) / o.towers;
    }
  }
  return mean;
}

// Every element's mean |gradient| over every tower of the group at `init` (the towers of o, in each
// process): the scale of element i's rounding in a sum over the towers.
std::vector<double> group_mean_abs_gradient(const ProcessGroup& pg, const TowerOptions& o, std::uint64_t seed,
                                            const std::vector<float>& init) {
  const auto own = own_mean_gradient(o, pg.rank(), seed, init);
  const std::vector<double> mine(own.begin() + static_cast<std::ptrdiff_t>(init.size()), own.end());
  const auto all = pg.allgather(mine);
  std::vector<double> a(init.size(), 0.0);
  for (std::size_t r = 0; r < static_cast<std::size_t>(pg.size()); ++r)
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += all[r * a.size() + i] / pg.size();
  return a;
}

// Two runs of the same two momentum steps whose sums over the K towers differ only in their order:
// element i's average over the towers rounds by at most about K u a_i in each run (a_i its mean
// |gradient|), which the momentum carries into the parameter with weight lr (1 + (1 + m)) after two
// steps; 8x that covers the second step's gradient at parameters already apart, a_max's term the
// couplings between elements, and two ulps the parameter's own rounding. A fault confined to one
// element (its gradient missing a node's share, say) moves it by about lr a_i: far beyond, where a
// bound from the largest move over every parameter lets through any element whose update is small.
// It assumes each tower's gradients are the same bits in both runs (one machine: the same ISA and
// thread count). Returns how many elements are beyond, each of the first few named.
std::size_t beyond_rounding(const std::vector<float>& x, const std::vector<float>& y, const std::vector<double>& a,
                            const OptimizerConfig& opt, int towers, const char* what) {
  const double u = std::ldexp(1.0, -24), w = opt.lr * (2.0 + opt.momentum);
  const double a_max = *std::max_element(a.begin(), a.end());
  std::size_t n = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float big = std::max(std::abs(x[i]), std::abs(y[i]));
    const double ulp = std::nextafter(big, std::numeric_limits<float>::infinity()) - big;
    const double bound = 2 * ulp + 8 * u * w * towers * a[i] + u * w * towers * a_max;
    const double d = std::abs(double{x[i]} - y[i]);
    if (!(d <= bound) && n++ < 5)  // a NaN on either side is beyond too
      ADD_FAILURE() << what << ": parameter " << i << " differs by " << d << ", beyond its rounding " << bound
                    << " (mean |gradient| " << a[i] << ")";
  }
  return n;
}

TEST(Dist, TwoLevelsEqualReplicated) {
  auto& pg = test_group();
  expect_the_launched_ranks(pg);
  if (pg.size() < 2) GTEST_SKIP() << "run under a launcher with 2 or more processes (ctest: dist.two_nodes)";
  ASSERT_TRUE(pg.has_levels()) << pg.levels_why();
  if (const char* nodes = std::getenv("STEPBENCH_TEST_NODES")) {  // ctest's: the split must have happened
    ASSERT_EQ(pg.nodes(), std::atoi(nodes));
    ASSERT_EQ(pg.across_nodes().size(), pg.nodes());
    ASSERT_EQ(pg.within_node().size(), pg.size() / pg.nodes());
  }
  const auto run = [&](VariableUpdate mode, int towers, ProcessGroup* group, int ps_ranks = 1) {
    auto o = tiny_dist(BackendKind::cpu, towers, mode, false);
    o.group = group;
    o.ps_ranks = ps_ranks;
    Towers t(o);
    t.set_synthetic_batch(77);  // process r gets the batch of tower r
    std::vector<float> before = tower_params(t, 0);
    for (int k = 0; k < 2; ++k) t.step();
    t.synchronize();
    return std::make_pair(std::move(before), tower_params(t, group ? 0 : pg.rank()));
  };
  const auto [init, two_level] = run(VariableUpdate::distributed_all_reduce, 1, &pg);
  const auto flat = run(VariableUpdate::replicated, 1, &pg).second;
  const auto local = run(VariableUpdate::replicated, pg.size(), nullptr).second;
  EXPECT_TRUE(every_rank_holds(pg, two_level)) << "the ranks' parameters differ";
  double moved = 0;  // the steps moved the parameters (two runs that moved nothing would agree)
  for (std::size_t i = 0; i < init.size(); ++i) moved = std::max(moved, std::abs(double{flat[i]} - init[i]));
  ASSERT_GT(moved, 0.0);
  // the same update, element by element, to the rounding of its order of summation
  const OptimizerConfig opt = tiny_dist(BackendKind::cpu, 1, VariableUpdate::replicated, false).optimizer;
  const auto a1 =
      group_mean_abs_gradient(pg, tiny_dist(BackendKind::cpu, 1, VariableUpdate::replicated, false), 77, init);
  EXPECT_EQ(beyond_rounding(two_level, flat, a1, opt, pg.size(), "against replicated"), 0u);
  EXPECT_EQ(beyond_rounding(two_level, local, a1, opt, pg.size(), "against towers in one process"), 0u);
  // 2 towers per process: their sum within the process first, the average over every tower
  const auto two_each = run(VariableUpdate::distributed_all_reduce, 2, &pg).second;
  const auto local2 = run(VariableUpdate::replicated, 2 * pg.size(), nullptr).second;
  const auto a2 =
      group_mean_abs_gradient(pg, tiny_dist(BackendKind::cpu, 2, VariableUpdate::replicated, false), 77, init);
  EXPECT_EQ(beyond_rounding(two_each, local2, a2, opt, 2 * pg.size(), "2 towers each"), 0u);
  // distributed_replicated, with one server and with one per node, ends where parameter_server does
  const auto server = run(VariableUpdate::parameter_server, 1, &pg).second;
  for (int k : {1, pg.across_nodes().size()}) {
    SCOPED_TRACE(fmt::format("distributed_replicated, --ps-ranks {}", k));
    const auto dr = run(VariableUpdate::distributed_replicated, 1, &pg, k).second;
    EXPECT_TRUE(every_rank_holds(pg, dr)) << "the ranks' parameters differ";
    EXPECT_EQ(beyond_rounding(dr, server, a1, opt, pg.size(), "against parameter_server"), 0u);
  }
}

// --cross-replica-sync off with `servers` shards: every worker (a process, or with node_workers a node)
// takes its own number of steps; then every server must have applied each of its pushes once (count
// and sum), every process must hold the shards the servers sent at the versions it last pulled, and
// each server's master copy must be the initial variables less lr times every push (plain SGD, so
// that the order they came in does not matter).
void expect_every_push_applied_once(ProcessGroup& pg, VariableUpdate mode, int servers, bool node_workers) {
  // 2 towers per process
  auto o = tiny_dist(BackendKind::cpu, 2, mode, false);
  o.group = &pg;
  o.cross_replica_sync = false;
  o.async_checks = true;
  o.ps_ranks = mode == VariableUpdate::distributed_replicated ? servers : 1;
  o.optimizer.kind = OptimizerKind::sgd;
  o.optimizer.lr = 0.05f;
  const int worker = node_workers ? pg.across_nodes().rank() : pg.rank();
  const int steps = 3 + 2 * worker;  // the workers do not keep in step
  Towers t(o);
  EXPECT_TRUE(t.asynchronous());  // EXPECT up to the all-gather: a rank that returned would leave the rest waiting
  const std::uint64_t seed = 77 + static_cast<std::uint64_t>(pg.rank());
  t.set_synthetic_batch(seed);
  const std::vector<float> init = tower_params(t, 0);
  const auto own = own_mean_gradient(o, pg.rank(), seed, init);
  for (int k = 0; k < steps; ++k) t.step();
  t.synchronize();
  AsyncStats s = t.async_stats();
  const bool pusher = s.worker >= 0;
  EXPECT_EQ(pusher, !node_workers || pg.within_node().rank() == 0);
  EXPECT_EQ(s.pushes, pusher ? steps : 0);
  EXPECT_EQ(tower_params(t, 1), tower_params(t, 0)) << "a worker's towers hold what it pulled";
  EXPECT_EQ(s.servers, servers);
  EXPECT_EQ(s.versions.size(), static_cast<std::size_t>(servers));
  EXPECT_EQ(s.shard_hashes.size(), static_cast<std::size_t>(servers));
  s.versions.resize(static_cast<std::size_t>(servers));
  s.shard_hashes.resize(static_cast<std::size_t>(servers));
  // per process: its worker, whether it pushes, its pushes and their sum; per server the version of its
  // shard and that shard's hash. A push returns with the shard, so once every process is in the
  // all-gather every server has applied every push.
  std::vector<double> mine{static_cast<double>(worker), pusher ? 1.0 : 0.0, static_cast<double>(s.pushes),
                           s.pushed_sum};
  for (int k = 0; k < servers; ++k) {
    const auto i = static_cast<std::size_t>(k);
    mine.insert(mine.end(), {static_cast<double>(s.versions[i]), static_cast<double>(s.shard_hashes[i] >> 32),
                             static_cast<double>(s.shard_hashes[i] & 0xffffffffu)});
  }
  const std::size_t stride = mine.size();
  const auto all = pg.allgather(mine);
  // a worker's first push is the mean gradient of its towers (its node's, with node workers) at the
  // initial variables: each process's own mean, averaged over the processes of the worker
  const auto means = pg.allgather(own);
  if (pusher) {
    const std::size_t P = init.size();
    std::vector<double> want(P, 0.0), abs_mean(P, 0.0);
    int procs = 0;
    for (int r = 0; r < pg.size(); ++r) {
      if (all[static_cast<std::size_t>(r) * stride] != worker) continue;
      ++procs;
      const double* m = &means[static_cast<std::size_t>(r) * 2 * P];
      for (std::size_t j = 0; j < P; ++j) want[j] += m[j], abs_mean[j] += m[P + j];
    }
    // the towers' sum, the node's sum and the scale in fp32, against the exact mean
    const double terms = procs * o.towers, u = 0x1p-24;
    std::vector<double> bound(P);
    for (std::size_t j = 0; j < P; ++j) {
      want[j] /= procs;
      abs_mean[j] /= procs;
      bound[j] = (terms + 2) * u * abs_mean[j];
    }
    EXPECT_GT(*std::max_element(abs_mean.begin(), abs_mean.end()), 0.0);
    EXPECT_WITHIN(std::vector<double>(s.first_push.begin(), s.first_push.end()), want, bound)
        << "worker " << worker << "'s first push is not its towers' mean gradient";
  }
  std::vector<float> total(init.size(), 0.0f);
  if (pusher) std::copy(s.pushed_total.begin(), s.pushed_total.end(), total.begin());
  pg.allreduce_sum(total.data(), total.size());
  s = t.async_stats();
  const auto served = pg.allgather(std::vector<double>{static_cast<double>(s.applied), s.applied_sum});
  double pushes = 0, sum = 0, applied = 0, applied_sum = 0;
  for (int r = 0; r < pg.size(); ++r) {
    pushes += all[static_cast<std::size_t>(r) * stride + 2];
    sum += all[static_cast<std::size_t>(r) * stride + 3];
    applied += served[static_cast<std::size_t>(2 * r)];
    applied_sum += served[static_cast<std::size_t>(2 * r + 1)];
  }
  EXPECT_EQ(applied, servers * pushes) << "every push reaches every server once";
  EXPECT_NEAR(applied_sum, sum, 1e-9 * (1 + std::abs(sum))) << "the shards applied add up to the pushes";
  if (s.serves < 0) return;
  // this process serves shard k = [F k / K, F (k + 1) / K)
  const int k = s.serves;
  const std::size_t b = init.size() * static_cast<std::size_t>(k) / static_cast<std::size_t>(servers);
  const std::size_t n = init.size() * static_cast<std::size_t>(k + 1) / static_cast<std::size_t>(servers) - b;
  ASSERT_EQ(s.shard_floats, n);
  ASSERT_EQ(s.applied_per_worker.size(), static_cast<std::size_t>(pg.size()));
  double mine_pushes = 0;
  for (int r = 0; r < pg.size(); ++r) {
    const double* p = &all[static_cast<std::size_t>(r) * stride];
    SCOPED_TRACE(fmt::format("shard {}, rank {} (worker {})", k, r, p[0]));
    EXPECT_EQ(static_cast<double>(s.applied_per_worker[static_cast<std::size_t>(r)]), p[2]);
    mine_pushes += p[2];
    // the process holds the shard this server sent at the version its worker last pulled (the rest of
    // a node got it from the node's first process, which pushed for it)
    const double* pushed = p;
    for (int q = 0; q < pg.size(); ++q) {
      const double* o = &all[static_cast<std::size_t>(q) * stride];
      if (o[0] == p[0] && o[1] == 1.0) pushed = o;
    }
    ASSERT_EQ(pushed[1], 1.0) << "no process pushed for worker " << p[0];
    const auto version = static_cast<std::size_t>(pushed[4 + 3 * k]);
    ASSERT_LT(version, s.sent_hashes.size());
    const std::uint64_t h = s.sent_hashes[version];
    EXPECT_EQ(static_cast<double>(h >> 32), p[5 + 3 * k]) << "at version " << version;
    EXPECT_EQ(static_cast<double>(h & 0xffffffffu), p[6 + 3 * k]) << "at version " << version;
  }
  EXPECT_EQ(static_cast<double>(s.applied), mine_pushes);
  // the staleness, exactly: a pusher whose i-th push found the shard at version v_i had pulled v_(i-1) + 1,
  // so its pushes' staleness adds up to v_last - (pushes - 1), that is its version now less its pushes
  ASSERT_EQ(s.staleness.size(), static_cast<std::size_t>(s.applied));
  ASSERT_FALSE(s.staleness.empty());
  EXPECT_EQ(s.staleness[0], 0.0) << "the first push applied found the shard as built";
  double stale = 0, expected = 0;
  for (double x : s.staleness) stale += x;
  for (int r = 0; r < pg.size(); ++r) {
    const double* p = &all[static_cast<std::size_t>(r) * stride];
    if (p[1] == 1.0) expected += p[4 + 3 * k] - p[2];
  }
  EXPECT_EQ(stale, expected) << "the staleness of the shards applied";
  // the master copy: the initial shard minus lr times every push, element by element
  ASSERT_EQ(s.master.size(), n);
  double moved = 0;
  for (std::size_t i = b; i < b + n; ++i) moved = std::max(moved, std::abs(0.05 * total[i]));
  ASSERT_GT(moved, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_NEAR(s.master[i], init[b + i] - 0.05 * total[b + i], 1e-4 * moved) << "variable " << b + i;
}  // the towers go: every worker says goodbye to every server, and each server's thread ends

TEST(Dist, AsynchronousServerAppliesEveryPushOnce) {
  auto& pg = test_group();
  expect_the_launched_ranks(pg);
  if (pg.size() < 2) GTEST_SKIP() << "run under a launcher with 2 or more processes (ctest: dist.launch)";
  if (pg.uses_mpi()) GTEST_SKIP() << "the asynchronous server answers on a thread of its own: Gloo only";
  expect_every_push_applied_once(pg, VariableUpdate::parameter_server, 1, false);
}

TEST(Dist, AsynchronousShardedServersApplyEveryPushOnce) {
  auto& pg = test_group();
  expect_the_launched_ranks(pg);
  if (!pg.has_levels() || pg.across_nodes().size() < 2)
    GTEST_SKIP() << "distributed_replicated's workers are nodes: run on 2 nodes or more (ctest: dist.two_nodes)";
  if (pg.uses_mpi()) GTEST_SKIP() << "the asynchronous servers answer on a thread of their own: Gloo only";
  for (int k : {1, pg.across_nodes().size()}) {
    SCOPED_TRACE(fmt::format("distributed_replicated, --ps-ranks {}", k));
    expect_every_push_applied_once(pg, VariableUpdate::distributed_replicated, k, true);
  }
}

TEST(Dist, NcclRanksEqualTheOracle) {
  auto& pg = test_group();
  expect_the_launched_ranks(pg);
  if (pg.size() < 2) GTEST_SKIP() << "run under a launcher with 2 or more processes (gpu-check.sh ranks)";
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const int visible = cuda_device_count(), per_gpu = (pg.local_size() + visible - 1) / visible;
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  const GpuSharing share =
      nccl_gpu_sharing(nccl_version(), per_gpu, 1, pg.size(), pg.rank(), host, pg.local_size() == pg.size());
  for (const auto& v : share.env) setenv(v.name.c_str(), v.value.c_str(), v.overwrite ? 1 : 0);
  if (pg.rank() == 0) std::printf("NCCL %s; %s\n", nccl_version_string().c_str(), share.how.c_str());
  struct Case {
    DistMode mode;
    bool overlap;
    Precision precision;
    bool graph;  // replayed from a CUDA Graph (the collective inside)
  };
  std::vector<Case> cases;
  for (const DistMode& m : kModes)
    for (bool overlap : {true, false}) cases.push_back({m, overlap, Precision::fp32, false});
  cases.push_back({kModes[0], true, Precision::bf16, false});
  cases.push_back({kModes[1], true, Precision::bf16, false});
  cases.push_back({kModes[0], true, Precision::fp32, true});
  cases.push_back({kModes[0], true, Precision::bf16, true});
  if (pg.has_levels()) {  // distributed_all_reduce: NCCL communicators split by node (one node: all in one)
    const DistMode two{VariableUpdate::distributed_all_reduce, false};
    for (bool overlap : {true, false}) cases.push_back({two, overlap, Precision::fp32, false});
    cases.push_back({two, true, Precision::bf16, false});
    cases.push_back({two, true, Precision::fp32, true});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{}, overlap {}, {}{}", c.mode.name(), c.overlap ? "on" : "off", to_string(c.precision),
                             c.graph ? ", CUDA Graph" : ""));
    auto o = tiny_dist(BackendKind::cuda, 1, c.mode.update, c.mode.on_host);
    o.layout = Layout::nhwc;
    o.precision = c.precision;
    o.overlap = c.overlap;
    o.group = &pg;
    o.ranks_per_gpu = per_gpu;
    o.gpu_sharing = share.how;
    o.sync_timeout_s = 120;
    Towers g(o);
    g.set_synthetic_batch(3);
    // every rank's batch, as towers in one process draw them (tower r = rank r), in NCHW fp32
    auto co = tiny_dist(BackendKind::cpu, pg.size(), c.mode.update, c.mode.on_host);
    Towers h(co);
    h.set_synthetic_batch(3);
    const test::ChainOracle base(g.graph(0));  // this rank's structure, dtype and parameters
    std::vector<test::ChainOracle> slices;
    for (int t = 0; t < pg.size(); ++t) {
      const Tensor in = h.graph(t).input_tensor();
      const auto* x = static_cast<const float*>(in.data);
      std::vector<double> img(x, x + in.desc.numel());
      std::vector<std::int32_t> labels(static_cast<std::size_t>(in.desc.shape.n));
      std::memcpy(labels.data(), h.graph(t).labels(), labels.size() * sizeof(std::int32_t));
      slices.push_back(base);
      slices.back().set_batch(test::round_to(o.dtype(), img), labels);
    }
    const int steps = 3;
    const auto want =
        test::oracle_steps(slices, o.optimizer, steps, test::error_model({"cuda", o.layout, o.dtype(), false}));
    if (c.graph) {
      g.step();  // warm-up outside the capture, as the bench does; the capture records without running
      g.synchronize();
      g.capture(true);
      for (int k = 1; k < steps; ++k) g.replay(true);
    } else {
      for (int k = 0; k < steps; ++k) g.step();
    }
    g.synchronize();
    EXPECT_TRUE(test::params_within(g.graph(0), want)) << "rank " << pg.rank();
    EXPECT_TRUE(every_rank_holds(pg, tower_params(g, 0))) << "the ranks' parameters differ";
    if (c.overlap && !c.mode.on_host) {
      EXPECT_GT(g.overlapped_buckets(), 0u);
    }
  }
}

}  // namespace
}  // namespace stepbench
