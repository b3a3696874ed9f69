// stepbench: times a CNN training step's phases, and checks numerics against a reference.
//   stepbench [flags]           Google Benchmark fixtures of every phase, then a summary
//   stepbench check ...         run given weights and input, write logits/loss/gradients
//   stepbench make-dataset DIR  write a synthetic JPEG or PNG folder for --data DIR
//   stepbench make-records DIR OUT  the folder pre-resized into a record file for --data OUT
//   stepbench launch --nproc N -- ARGS  N processes of a run on this node (cli/launch.cpp)
// The environment is read here and nowhere below: the launcher's variables (mpirun, srun,
// torchrun, stepbench launch), what NCCL needs for ranks that share a GPU, and the test-only fault
// injection.
#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include <unistd.h>

#include "bench/bench.hpp"
#include "bench/sweep.hpp"
#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "comm/collective.hpp"
#include "comm/launch_env.hpp"
#include "comm/process_group.hpp"
#include "models/models.hpp"
#include "stepbench_revision.hpp"
#include "tensor/error.hpp"

using namespace stepbench;

namespace {

// The first SIGINT or SIGTERM: stored for the benchmarks to poll (BenchConfig::interrupt), so that
// what was measured is reported and written whole; the handler then steps aside, and a second one
// ends the process at once.
std::atomic<int> interrupted{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler stores into it");
extern "C" void on_interrupt(int sig) {
  int none = 0;
  interrupted.compare_exchange_strong(none, sig);  // the first one is what is reported
  std::signal(SIGINT, SIG_DFL);                    // the next SIGINT or SIGTERM ends the process
  std::signal(SIGTERM, SIG_DFL);
}
void catch_interrupts() {
  struct sigaction a {};
  a.sa_handler = on_interrupt;
  a.sa_flags = SA_RESTART;  // reads of the peer's pipe and of files carry on instead of failing with EINTR
  sigemptyset(&a.sa_mask);
  sigaddset(&a.sa_mask, SIGINT);
  sigaddset(&a.sa_mask, SIGTERM);
  sigaction(SIGINT, &a, nullptr);
  sigaction(SIGTERM, &a, nullptr);
}

// Ranks that share a GPU (--ranks-per-gpu, or stepbench launch on fewer GPUs than processes): what
// the loaded NCCL needs (comm/collective.hpp), set before it initialises; returns how, for the report.
std::string share_gpus(const TowerOptions& r, const ProcessGroup& g) {
  if (r.backend != BackendKind::cuda) return "";
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  const GpuSharing s =
      nccl_gpu_sharing(nccl_version(), r.ranks_per_gpu, r.towers, g.size(), g.rank(), host, g.local_size() == g.size());
  if (s.refused) throw UsageError(s.how);
  if (!s.env.empty() && std::getenv("NCCL_COMM_BLOCKING"))
    throw UsageError(
        "NCCL_COMM_BLOCKING overrides how stepbench runs NCCL (its initialisation non-blocking, polled under "
        "--sync-timeout-s; the step's communicators blocking): unset it");
  for (const auto& v : s.env) setenv(v.name.c_str(), v.value.c_str(), v.overwrite ? 1 : 0);
  return s.how;
}

// STEPBENCH_FAULT_SYNC_STALL=<rank>:<seconds> (tests only): that process stalls before its first sync;
// STEPBENCH_FAULT_INIT_STALL likewise before its NCCL initialisation (after the unique id came).
double fault_stall(const char* variable, int rank) {
  const char* f = std::getenv(variable);
  int r = -1;
  double sec = 0;
  return f && std::sscanf(f, "%d:%lf", &r, &sec) == 2 && r == rank ? sec : 0.0;
}

// STEPBENCH_FAULT_SLOW_CONV=<shape>/<direction>*<repeats> (tests only, backend/slow_conv.hpp): that
// conv shape's direction runs 1 + repeats times, e.g. conv:4x16x15x15>24:k3x3:s1x1:p1x1/fwd*20.
SlowConvFault fault_slow_conv() {
  SlowConvFault f;
  const char* v = std::getenv("STEPBENCH_FAULT_SLOW_CONV");
  if (!v || !*v) return f;
  const std::string s = v;
  const auto star = s.rfind('*'), slash = s.rfind('/', star);
  if (star == std::string::npos || slash == std::string::npos)
    throw UsageError(
        fmt::format("STEPBENCH_FAULT_SLOW_CONV={}: expected <shape>/<fwd|bwd_data|bwd_filter>*<repeats>", s));
  f.shape = s.substr(0, slash);
  f.direction = s.substr(slash + 1, star - slash - 1);
  f.repeats = std::atoi(s.c_str() + star + 1);
  if (f.direction != "fwd" && f.direction != "bwd_data" && f.direction != "bwd_filter")
    throw UsageError(
        fmt::format("STEPBENCH_FAULT_SLOW_CONV: direction '{}' is not fwd, bwd_data or bwd_filter", f.direction));
  fmt::print(stderr, "stepbench: test fault: {} {} runs {} extra times\n", f.shape, f.direction, f.repeats);
  return f;
}

// Where bench/torch_peer.py may be: beside the binary in a bundle (bin/..), else the source tree
// this binary was built from.
std::vector<std::string> peer_dirs() {
  std::vector<std::string> d;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) d.push_back(exe.parent_path().parent_path().string());
  d.emplace_back(STEPBENCH_SOURCE_DIR);
  return d;
}

// The Pythons --peer tries when --peer-python is not given, in order: an activated virtual
// environment or conda environment, python3 on PATH, Debian's, and the torch venv of this project's
// GPU machines.
std::vector<std::string> peer_pythons() {
  std::vector<std::string> p;
  for (const char* v : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* d = std::getenv(v); d && *d) p.push_back(std::string(d) + "/bin/python");
  for (const char* s : {"python3", "/usr/bin/python3", "/opt/torch/.venv/bin/python"}) p.emplace_back(s);
  return p;
}

void print_version() {
  // what this binary was built with; scripts/gpu-check.sh refuses a build without the cuda backend
#ifdef STEPBENCH_HAVE_CUDA
  const std::string cuda = fmt::format("on (architectures {})", STEPBENCH_CUDA_ARCHITECTURES);
#else
  const std::string cuda = "off";
#endif
  fmt::print("stepbench {} ({})\ncuda backend: {}\nmpi: {}\ngloo: {}\n", STEPBENCH_VERSION, STEPBENCH_REVISION, cuda,
             built_with_mpi() ? "on" : "off", built_with_gloo() ? "on" : "off");
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<ProcessGroup> group;
  try {
    const std::string_view cmd = argc > 1 ? argv[1] : "";
    if (cmd == "check") return cli::check_main(argc, argv);
    if (cmd == "make-dataset") return cli::make_dataset_main(argc, argv);
    if (cmd == "make-records") return cli::make_records_main(argc, argv);
    if (cmd == "compare") return cli::compare_main(argc, argv);
    if (argc == 2 && cmd == "--version") {
      print_version();
      return 0;
    }
    if (cmd == "launch") return cli::launch_main(argc, argv);
    cli::Options o;
    if (auto rc = cli::parse(argc, argv, o)) return *rc;
    if (o.version) {
      print_version();
      return 0;
    }
    if (o.list_models) {
      fmt::print("{}", models_table());
      return 0;
    }
    LaunchEnv env = discover_launch([](const char* v) { return std::getenv(v); }, o.rendezvous, built_with_mpi());
    if (o.procs_per_node > 0) split_nodes(env, o.procs_per_node);
    // a peer that died: Gloo's write to it fails, and names it, instead of SIGPIPE ending this process
    if (env.multi()) std::signal(SIGPIPE, SIG_IGN);
    group = ProcessGroup::create(env, o.sync_timeout_s, /*point_to_point=*/!o.cross_replica_sync);
    cli::resolve(o, group->local_size(), env.launcher == Launcher::stepbench);
    o.bench.run.gpu_sharing = share_gpus(o.bench.run, *group);
    if (!o.given("--peer-python")) o.bench.peer_pythons = peer_pythons();
    o.bench.run.group = group.get();
    o.bench.run.fault_sync_stall_s = fault_stall("STEPBENCH_FAULT_SYNC_STALL", group->rank());
    o.bench.run.fault_init_stall_s = fault_stall("STEPBENCH_FAULT_INIT_STALL", group->rank());
    o.bench.run.fault_slow_conv = fault_slow_conv();
    o.bench.revision = STEPBENCH_REVISION;
    o.bench.interrupt = &interrupted;
    catch_interrupts();
    if (o.bench.sweep()) return run_sweep(o.bench, *group);
    return run_benchmarks(o.bench, *group, argv[0], peer_dirs());
  } catch (const UsageError& e) {            // also UnsupportedError: an impossible combination here
    const std::string_view what = e.what();  // a subcommand's ("stepbench launch: ...") names itself
    fmt::print(stderr, "{}{}\n", what.rfind("stepbench ", 0) == 0 ? "" : "stepbench: ", what);
    if (group) group->abort(2);  // under mpirun: end the other processes instead of leaving them waiting
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "stepbench: error: {}\n", e.what());
    if (group) group->abort(1);
    return 1;
  }
}
