// stepbench launch --nproc N [--nodes M] [--rendezvous ADDR] [--grace-s S] -- ARGS...
// stepbench launch --nnodes M --node-rank K --master HOST:PORT --nproc N [...] -- ARGS...
// One node's launcher, as torchrun --nproc-per-node: starts N processes with torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; with --nodes M, M groups of N / M that act as M
// nodes, each with torchrun's GROUP_RANK) plus STEPBENCH_LAUNCHER and STEPBENCH_RENDEZVOUS (a
// store folder it makes and removes), forwards SIGINT and SIGTERM to them once, and when one ends
// badly ends the others (SIGTERM, then SIGKILL after the grace period), naming it. ARGS are this
// stepbench's flags, or a program and its arguments when ARGS[0] does not start with '-'.
// Across machines (--nnodes M, one launcher per node, as torchrun's static rendezvous): node K's
// processes are ranks K N to K N + N - 1 of M N, GROUP_RANK K, meeting at --master (node 0's host,
// where rank 0 serves the store), or at --rendezvous.
// Each process runs in its own process group, so that a terminal's Ctrl-C reaches it once, through
// the launcher; each gets SIGTERM if the launcher dies.
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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

// --nnodes and --node-rank: where this launcher's processes stand among every machine's
struct Machines {
  int count = 1, rank = 0;
};

[[noreturn]] void exec_child(int local, int n, int nodes, Machines m, const std::string& rendezvous,
                             const std::vector<std::string>& args, pid_t launcher) {
  prctl(PR_SET_PDEATHSIG, SIGTERM);     // the launcher gone (even by SIGKILL): end too
  if (getppid() != launcher) _exit(1);  // it went before prctl took
  setpgid(0, 0);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  for (const char* v : kForeign) unsetenv(v);
  // --nodes M: M groups of n / M processes, each group a node of its own (torchrun's GROUP_RANK);
  // --nnodes: this machine's n processes are one node among m.count
  const int per = n / nodes, rank = m.rank * n + local;
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(local % per).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(n * m.count).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(per).c_str(), 1);
  if (nodes > 1 || m.count > 1)
    setenv("GROUP_RANK", std::to_string(m.count > 1 ? m.rank : local / per).c_str(), 1);
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

// HOST of --master HOST:PORT resolves, and on node 0 (whose rank 0 serves the store there) it is one
// of this machine's addresses; UsageError saying what to give otherwise.
void check_master(const std::string& host, const std::string& port, int node_rank) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
    throw UsageError(
        fmt::format("stepbench launch: --master {}:{}: {} does not resolve ({}); give node 0's host name "
                    "or address",
                    host, port, host, gai_strerror(rc)));
  bool here = false;
  for (addrinfo* a = res; a && !here; a = a->ai_next) {  // an address of this machine can be bound to
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    sockaddr_storage any{};
    std::memcpy(&any, a->ai_addr, a->ai_addrlen);
    if (any.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(any).sin_port = 0;
    if (any.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(any).sin6_port = 0;
    here = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&any), a->ai_addrlen) == 0;
    if (fd >= 0) close(fd);
  }
  freeaddrinfo(res);
  if (node_rank == 0 && !here)
    throw UsageError(fmt::format(
        "stepbench launch: --node-rank 0 runs rank 0, which serves the rendezvous at --master {}:{}, but {} is not "
        "an address of this machine: give this machine's host name, or start --node-rank 0 on {}",
        host, port, host, host));
}

void check_nodes(int nnodes, int node_rank, int nodes, const std::string& master, std::string& rendezvous) {
  if (node_rank >= nnodes)
    throw UsageError(fmt::format("stepbench launch: --node-rank {} is outside --nnodes {} (0 to {})", node_rank, nnodes,
                                 nnodes - 1));
  if (nnodes > 1 && nodes > 1)
    throw UsageError(
        "stepbench launch: --nodes poses nodes on one machine; across machines (--nnodes) each machine is a node");
  if (!master.empty()) {
    const auto colon = master.rfind(':');
    const std::string host = colon == std::string::npos ? "" : master.substr(0, colon);
    const std::string port = colon == std::string::npos ? "" : master.substr(colon + 1);
    char* end = nullptr;
    const long p = port.empty() ? 0 : std::strtol(port.c_str(), &end, 10);
    if (host.empty() || port.empty() || *end != '\0' || p < 1 || p > 65535)
      throw UsageError(
          fmt::format("stepbench launch: --master {}: give HOST:PORT, node 0's host and a free port", master));
    if (!rendezvous.empty())
      throw UsageError(
          "stepbench launch: give --master or --rendezvous, not both (--master HOST:PORT is "
          "--rendezvous tcp://HOST:PORT)");
    check_master(host, port, node_rank);
    rendezvous = "tcp://" + master;
  }
  if (nnodes > 1 && rendezvous.empty())
    throw UsageError(fmt::format(
        "stepbench launch: --nnodes {} needs where the machines meet: --master HOST:PORT (node 0's host and a free "
        "port), or --rendezvous file:PATH on a folder every machine shares",
        nnodes));
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
  int nproc = 0, nodes = 1, nnodes = 1, node_rank = 0;
  double grace_s = 10;
  std::string rendezvous, master;
  CLI::App app{
      "stepbench launch: start N processes of a run on this node, as torchrun --nproc-per-node does.\n"
      "  stepbench launch --nproc N -- --backend cpu --gpus 1 ...   (this stepbench's flags)\n"
      "  stepbench launch --nproc N -- PROGRAM ARGS...              (any program)\n"
      "  stepbench launch --nnodes 2 --node-rank K --master HOST:PORT --nproc N -- ...   (on each of 2 machines)",
      "stepbench launch"};
  app.add_option("--nproc", nproc, "processes to start (ranks 0 to N-1)")->required()->check(CLI::Range(1, 4096));
  app.add_option("--nodes", nodes,
                 "act as this many nodes: N / M processes each, with node ids of their own (two-level sync "
                 "on one machine)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", nnodes, "machines of the run, one launcher on each (all with the same --nproc)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--node-rank", node_rank, "this machine's place among them, 0 to --nnodes - 1 (0: rank 0's)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4095));
  app.add_option("--master", master,
                 "HOST:PORT where the machines meet: node 0's host (rank 0 serves the rendezvous there) and a free "
                 "port");
  app.add_option("--rendezvous", rendezvous,
                 "where they meet: file:PATH or tcp://HOST:PORT [default: --master's, else a fresh folder under "
                 "/tmp]");
  app.add_option("--grace-s", grace_s, "after one process fails, how long the others get to end before SIGKILL")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  if (auto rc = parse_args(app, sep, argv, 2, "stepbench launch")) return *rc;
  if (sep >= argc - 1)
    throw UsageError("stepbench launch: give the run after --, e.g. stepbench launch --nproc 2 -- --backend cpu");
  const std::vector<std::string> args(argv + sep + 1, argv + argc);
  check_nodes(nnodes, node_rank, nodes, master, rendezvous);
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
    if (p == 0) exec_child(r, nproc, nodes, {nnodes, node_rank}, rendezvous, args, launcher);
    pids[static_cast<std::size_t>(r)] = p;
  }

  const int first_rank = node_rank * nproc;  // this machine's first
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
          fmt::print(stderr, "stepbench launch: rank {} (pid {}) {}{}\n", first_rank + rank, std::get<1>(gone.front()),
                     describe(status),
                     live > 0 ? fmt::format("; ending the other {} process{}", live, live == 1 ? "" : "es") : "");
        for (std::size_t g = 1; g < gone.size(); ++g)
          if (const int st = std::get<2>(gone[g]); !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
            fmt::print(stderr, "stepbench launch: then rank {} (pid {}) {}\n", first_rank + std::get<0>(gone[g]),
                       std::get<1>(gone[g]), describe(st));
        for (std::size_t r = 0; r < pids.size(); ++r)  // a stopped one is why the others waited
          if (pids[r] > 0 && process_state(pids[r]) == 'T')
            fmt::print(stderr,
                       "stepbench launch: rank {} (pid {}) is stopped (SIGSTOP or a debugger): it held up "
                       "the others\n",
                       first_rank + static_cast<int>(r), pids[r]);
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
