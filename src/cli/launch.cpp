// stepbench launch --nproc N [--nodes M] [--rendezvous ADDR] [--grace-s S] -- ARGS...
// One node's launcher, as torchrun --nproc-per-node: starts N processes with torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; with --nodes M, M groups of N / M that act as M
// nodes, each with torchrun's GROUP_RANK) plus STEPBENCH_LAUNCHER and STEPBENCH_RENDEZVOUS (a
// store folder it makes and removes), forwards SIGINT and SIGTERM to them once, and when one ends
// badly ends the others (SIGTERM, then SIGKILL after the grace period), naming it. ARGS are this
// stepbench's flags, or a program and its arguments when ARGS[0] does not start with '-'.
// Each process runs in its own process group, so that a terminal's Ctrl-C reaches it once, through
// the launcher; each gets SIGTERM if the launcher dies.
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "comm/launch_env.hpp"
#include "tensor/error.hpp"

namespace stepbench::cli {
namespace {

std::atomic<int> pending_signal{0};
extern "C" void on_launcher_signal(int sig) { pending_signal.store(sig); }

// The variables of another launcher, which would make a child take itself for one of its ranks.
const char* const kForeign[] = {
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "PMI_SIZE",    "PMI_RANK",   "PMIX_RANK",
    "SLURM_STEP_NUM_TASKS", "SLURM_PROCID",         "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"};

[[noreturn]] void exec_child(int rank, int n, int nodes, const std::string& rendezvous,
                             const std::vector<std::string>& args, pid_t launcher) {
  prctl(PR_SET_PDEATHSIG, SIGTERM);     // the launcher gone (even by SIGKILL): end too
  if (getppid() != launcher) _exit(1);  // it went before prctl took
  setpgid(0, 0);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  for (const char* v : kForeign) unsetenv(v);
  // --nodes M: M groups of n / M processes, each group a node of its own (torchrun's GROUP_RANK)
  const int per = n / nodes;
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank % per).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(per).c_str(), 1);
  if (nodes > 1)
    setenv("GROUP_RANK", std::to_string(rank / per).c_str(), 1);
  else
    unsetenv("GROUP_RANK");
  setenv("STEPBENCH_LAUNCHER", "stepbench", 1);
  setenv("STEPBENCH_RENDEZVOUS", rendezvous.c_str(), 1);
  if (!getenv("OMP_NUM_THREADS"))  // as torchrun: N processes of OpenMP teams over one node's cores
    setenv("OMP_NUM_THREADS", std::to_string(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN) / n)).c_str(), 1);
  const bool own = args.front().rfind('-', 0) == 0;
  std::vector<std::string> full;
  if (own) full.emplace_back("stepbench");
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(full.size() + 1);
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (own)
    execv("/proc/self/exe", argv.data());
  else
    execvp(argv[0], argv.data());
  fmt::print(stderr, "stepbench launch: rank {} could not start {}: {}\n", rank, full.front(), std::strerror(errno));
  _exit(127);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// The state letter of /proc/PID/stat ('T': stopped, e.g. by SIGSTOP), or '?'.
char process_state(pid_t p) {
  std::ifstream f(fmt::format("/proc/{}/stat", p));
  std::string line;
  std::getline(f, line);
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
}

}  // namespace

int launch_main(int argc, char** argv) {
  int sep = 2;
  while (sep < argc && std::strcmp(argv[sep], "--") != 0) ++sep;
  int nproc = 0, nodes = 1;
  double grace_s = 10;
  std::string rendezvous;
  CLI::App app{
      "stepbench launch: start N processes of a run on this node, as torchrun --nproc-per-node does.\n"
      "  stepbench launch --nproc N -- --backend cpu --gpus 1 ...   (this stepbench's flags)\n"
      "  stepbench launch --nproc N -- PROGRAM ARGS...              (any program)",
      "stepbench launch"};
  app.add_option("--nproc", nproc, "processes to start (ranks 0 to N-1)")->required()->check(CLI::Range(1, 4096));
  app.add_option("--nodes", nodes,
                 "act as this many nodes: N / M processes each, with node ids of their own (two-level sync "
                 "on one machine)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--rendezvous", rendezvous,
                 "where they meet: file:PATH or tcp://HOST:PORT [default: a fresh folder under /tmp]");
  app.add_option("--grace-s", grace_s, "after one process fails, how long the others get to end before SIGKILL")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  if (auto rc = parse_args(app, sep, argv, 2, "stepbench launch")) return *rc;
  if (sep >= argc - 1)
    throw UsageError("stepbench launch: give the run after --, e.g. stepbench launch --nproc 2 -- --backend cpu");
  const std::vector<std::string> args(argv + sep + 1, argv + argc);
  if (nproc % nodes != 0)
    throw UsageError(
        fmt::format("stepbench launch: --nproc {} does not split into --nodes {} of the same size: give "
                    "a multiple of {} processes",
                    nproc, nodes, nodes));
  if (!rendezvous.empty()) check_rendezvous_address(rendezvous);
  std::string folder;
  if (rendezvous.empty()) {
    char tmpl[] = "/tmp/stepbench-launch-XXXXXX";
    if (!mkdtemp(tmpl)) throw Error(fmt::format("stepbench launch: mkdtemp failed ({})", std::strerror(errno)));
    folder = tmpl;
    rendezvous = "file:" + folder;
  }

  struct sigaction a {};
  a.sa_handler = on_launcher_signal;
  sigemptyset(&a.sa_mask);
  sigaction(SIGINT, &a, nullptr);
  sigaction(SIGTERM, &a, nullptr);
  if (!getenv("OMP_NUM_THREADS"))
    fmt::print(stderr,
               "stepbench launch: OMP_NUM_THREADS={} for each of the {} processes ({} cores here); set it to "
               "choose\n",
               std::max(1L, sysconf(_SC_NPROCESSORS_ONLN) / nproc), nproc, sysconf(_SC_NPROCESSORS_ONLN));
  std::vector<pid_t> pids(static_cast<std::size_t>(nproc), -1);
  const pid_t launcher = getpid();
  for (int r = 0; r < nproc; ++r) {
    const pid_t p = fork();
    if (p < 0) throw Error(fmt::format("stepbench launch: fork failed ({})", std::strerror(errno)));
    if (p == 0) exec_child(r, nproc, nodes, rendezvous, args, launcher);
    pids[static_cast<std::size_t>(r)] = p;
  }

  int live = nproc, result = 0;
  bool ending = false;
  auto ending_since = std::chrono::steady_clock::now();
  auto signal_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) kill(p, sig);
  };
  while (live > 0) {
    if (const int sig = pending_signal.exchange(0)) {  // forwarded once per signal received
      signal_all(sig);
      if (!ending) {  // the processes get the grace period to end (and write what they measured)
        ending = true;
        ending_since = std::chrono::steady_clock::now();
      }
    }
    int status = 0;
    const pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      const auto it = std::find(pids.begin(), pids.end(), p);
      if (it == pids.end()) continue;
      int rank = static_cast<int>(it - pids.begin());
      *it = -1;
      --live;
      const bool bad = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (bad && !ending) {
        // the cause first: a process killed by a signal makes the others fail after it, and its exit may
        // be reaped after theirs; every exit already there is read now, and a signal's death is named
        // first, whatever order they came in
        // (a killed process may still be releasing its GPU context after its sockets closed: the
        // exits of the next half second are read too, before anyone is named)
        std::vector<std::tuple<int, pid_t, int>> gone = {{rank, p, status}};
        const auto first = std::chrono::steady_clock::now();
        while (live > 0 && std::chrono::steady_clock::now() - first < std::chrono::milliseconds(500)) {
          const pid_t q = waitpid(-1, &status, WNOHANG);
          if (q <= 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
          }
          const auto jt = std::find(pids.begin(), pids.end(), q);
          if (jt == pids.end()) continue;
          gone.emplace_back(static_cast<int>(jt - pids.begin()), q, status);
          *jt = -1;
          --live;
        }
        std::stable_partition(gone.begin(), gone.end(), [](const auto& g) { return WIFSIGNALED(std::get<2>(g)); });
        std::tie(rank, std::ignore, status) = gone.front();
        result = exit_code(status);  // the cause's status is the launcher's
        ending = true;
        ending_since = std::chrono::steady_clock::now();
        if (live > 0 || gone.size() > 1)
          fmt::print(stderr, "stepbench launch: rank {} (pid {}) {}{}\n", rank, std::get<1>(gone.front()),
                     describe(status),
                     live > 0 ? fmt::format("; ending the other {} process{}", live, live == 1 ? "" : "es") : "");
        for (std::size_t g = 1; g < gone.size(); ++g)
          if (const int st = std::get<2>(gone[g]); !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
            fmt::print(stderr, "stepbench launch: then rank {} (pid {}) {}\n", std::get<0>(gone[g]),
                       std::get<1>(gone[g]), describe(st));
        for (std::size_t r = 0; r < pids.size(); ++r)  // a stopped one is why the others waited
          if (pids[r] > 0 && process_state(pids[r]) == 'T')
            fmt::print(stderr,
                       "stepbench launch: rank {} (pid {}) is stopped (SIGSTOP or a debugger): it held up "
                       "the others\n",
                       r, pids[r]);
        signal_all(SIGTERM);
      } else if (bad && result == 0) {
        result = exit_code(status);
      }
      continue;
    }
    if (ending && std::chrono::duration<double>(std::chrono::steady_clock::now() - ending_since).count() > grace_s) {
      fmt::print(stderr, "stepbench launch: {} process{} still running {:g} s later: killed\n", live,
                 live == 1 ? "" : "es", grace_s);
      signal_all(SIGKILL);
      ending_since = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!folder.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(folder, ec);
  }
  return result;
}

}  // namespace stepbench::cli
