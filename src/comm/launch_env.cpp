// discover_launch: the launchers' variables, read through the caller's lookup, checked together.
#include "comm/launch_env.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "tensor/error.hpp"

namespace stepbench {
namespace {

// A variable as a whole non-negative number; nullopt when unset; UsageError when it is not one.
std::optional<long> number(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno != 0 || n < 0 || n > 1L << 30)
    throw UsageError(
        fmt::format("{}={} is not a whole number from 0 up: the launcher's variables are malformed", name, v));
  return n;
}

std::string text(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v ? v : "";
}

// The rank, size and local rank and size, read from four variables of one launcher.
struct Vars {
  const char *rank, *size, *local_rank, *local_size;
};
void read_vars(const EnvLookup& env, const Vars& v, LaunchEnv& e) {
  const auto rank = number(env, v.rank), size = number(env, v.size);
  if (!rank || !size)
    throw UsageError(
        fmt::format("{} is set but {} is not: set both (or neither)", rank ? v.rank : v.size, rank ? v.size : v.rank));
  e.rank = static_cast<int>(*rank);
  e.size = static_cast<int>(*size);
  const auto lr = v.local_rank ? number(env, v.local_rank) : std::nullopt;
  const auto ls = v.local_size ? number(env, v.local_size) : std::nullopt;
  // without the local variables every process is taken to be on this node
  e.local_rank = static_cast<int>(lr.value_or(*rank));
  e.local_size = static_cast<int>(ls.value_or(lr ? 0 : *size));
  e.source = fmt::format("{}={} {}={}", v.rank, *rank, v.size, *size);
  if (lr) e.source += fmt::format(" {}={}", v.local_rank, *lr);
  if (ls) e.source += fmt::format(" {}={}", v.local_size, *ls);
  if (lr && !ls && v.local_size)
    throw UsageError(fmt::format("{} is set but {} is not: set both", v.local_rank, v.local_size));
}

void check(const LaunchEnv& e) {
  if (e.size < 1) throw UsageError(fmt::format("{}: the world size must be at least 1", e.source));
  if (e.rank >= e.size)
    throw UsageError(fmt::format("{}: the rank is outside the world (0 to {})", e.source, e.size - 1));
  if (e.local_size < 1 || e.local_size > e.size)
    throw UsageError(fmt::format("{}: the processes on this node ({}) must be 1 to the world size ({})", e.source,
                                 e.local_size, e.size));
  if (e.local_rank >= e.local_size)
    throw UsageError(
        fmt::format("{}: the local rank {} is outside this node's {} processes", e.source, e.local_rank, e.local_size));
  if (e.size > 1 || e.launcher != Launcher::none) check_rendezvous_address(e.rendezvous);
}

// Which node of how many (LaunchEnv::node), from the launcher's variables; UsageError where they
// disagree with the ranks (a node past the last, processes that do not fill whole nodes).
void set_node(const EnvLookup& env, LaunchEnv& e) {
  const int per = e.local_size;
  if (e.launcher == Launcher::slurm) {
    e.node = static_cast<int>(number(env, "SLURM_NODEID").value_or(0));
    // SLURM_NNODES, else the nodes SLURM_STEP_TASKS_PER_NODE lists ("2(x3),1": 4)
    int listed = 0;
    const std::string per_node = text(env, "SLURM_STEP_TASKS_PER_NODE");
    for (std::size_t pos = 0; !per_node.empty() && pos <= per_node.size();) {
      const std::size_t end = std::min(per_node.find(',', pos), per_node.size());
      int tasks = 0, repeat = 1;
      std::sscanf(per_node.substr(pos, end - pos).c_str(), "%d(x%d)", &tasks, &repeat);
      listed += repeat;
      pos = end + 1;
    }
    e.nodes = static_cast<int>(number(env, "SLURM_NNODES").value_or(listed > 0 ? listed : e.node + 1));
  } else if (const auto group = number(env, "GROUP_RANK")) {
    if (e.size % per != 0)
      throw UsageError(
          fmt::format("{} GROUP_RANK={}: {} processes do not fill nodes of {} (LOCAL_WORLD_SIZE): give "
                      "every node the same number",
                      e.source, *group, e.size, per));
    e.node = static_cast<int>(*group);
    e.nodes = e.size / per;
    e.source += fmt::format(" GROUP_RANK={}", *group);
  } else {
    e.nodes = (e.size + per - 1) / per;
    e.node = e.rank / per;
  }
  if (e.nodes < 1 || e.node < 0 || e.node >= e.nodes)
    throw UsageError(fmt::format("{}: node {} is outside the {} nodes", e.source, e.node, e.nodes));
}

// MASTER_ADDR and MASTER_PORT as a store address (port + offset), or "" when MASTER_ADDR is unset.
std::string master(const EnvLookup& env, int offset) {
  const std::string addr = text(env, "MASTER_ADDR");
  if (addr.empty()) return "";
  const auto port = number(env, "MASTER_PORT");
  if (!port) throw UsageError("MASTER_ADDR is set but MASTER_PORT is not: set both, or give --rendezvous");
  if (*port + offset > 65535) throw UsageError(fmt::format("MASTER_PORT={} is not a TCP port", *port));
  return fmt::format("tcp://{}:{}", addr, *port + offset);
}

const char* const kNoMpi =
    "stepbench was built without MPI; give --rendezvous file:PATH (a path every process sees) or "
    "tcp://HOST:PORT (rank 0's host, a free port), or launch with stepbench launch, torchrun or srun";

LaunchEnv from_mpi(const EnvLookup& env, bool with_mpi, const std::string& flag) {
  LaunchEnv e;
  e.launcher = Launcher::mpi;
  if (env("OMPI_COMM_WORLD_SIZE"))
    read_vars(
        env,
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        e);
  else if (env("MV2_COMM_WORLD_SIZE"))
    read_vars(env,
              {"MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"},
              e);
  else if (env("PMI_SIZE"))
    read_vars(env, {"PMI_RANK", "PMI_SIZE", nullptr, nullptr}, e);
  else if (with_mpi)  // PMIx gives its rank alone; MPI says the rest
    e.source = fmt::format("PMIX_RANK={}", text(env, "PMIX_RANK"));
  else
    throw UsageError(fmt::format(
        "launched by a PMIx launcher (PMIX_RANK={}) that says no world size, and {}; or set RANK and WORLD_SIZE",
        text(env, "PMIX_RANK"), kNoMpi));
  if (!flag.empty())
    e.rendezvous = flag;
  else if (with_mpi)
    e.rendezvous = "mpi";
  else
    throw UsageError(fmt::format("launched by mpirun or a PMI launcher ({}), but {}", e.source, kNoMpi));
  return e;
}

LaunchEnv from_slurm(const EnvLookup& env, const std::string& flag) {
  LaunchEnv e;
  e.launcher = Launcher::slurm;
  read_vars(env, {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", nullptr}, e);
  const std::string per_node = text(env, "SLURM_STEP_TASKS_PER_NODE");
  const int node = static_cast<int>(number(env, "SLURM_NODEID").value_or(0));
  e.local_size = per_node.empty() ? e.size : slurm_tasks_on_node(per_node, node);
  e.source += fmt::format(" SLURM_STEP_TASKS_PER_NODE={} SLURM_NODEID={}", per_node, node);
  if (!flag.empty()) {
    e.rendezvous = flag;
  } else if (const std::string m = master(env, 0); !m.empty()) {
    e.rendezvous = m;  // the job script exported them, as for torchrun
  } else {
    const std::string nodes =
        text(env, "SLURM_STEP_NODELIST").empty() ? text(env, "SLURM_NODELIST") : text(env, "SLURM_STEP_NODELIST");
    if (nodes.empty())
      throw UsageError("srun: neither SLURM_STEP_NODELIST nor MASTER_ADDR is set; give --rendezvous tcp://HOST:PORT");
    const long job = number(env, "SLURM_JOB_ID").value_or(0), step = number(env, "SLURM_STEP_ID").value_or(0);
    e.rendezvous = fmt::format("tcp://{}:{}", slurm_first_host(nodes), 15000 + (job * 16 + step) % 20000);
  }
  return e;
}

LaunchEnv from_torchrun(const EnvLookup& env, Launcher l, const std::string& flag) {
  LaunchEnv e;
  e.launcher = l;
  read_vars(env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}, e);
  if (!flag.empty()) {
    e.rendezvous = flag;
  } else if (const char* own = env("STEPBENCH_RENDEZVOUS"); own && *own) {
    e.rendezvous = own;
  } else {
    // torchrun's agent listens on MASTER_PORT with PyTorch's own store; stepbench's goes beside it
    e.rendezvous = master(env, env("TORCHELASTIC_RUN_ID") ? 1 : 0);
    if (e.rendezvous.empty())
      throw UsageError(
          fmt::format("{} but MASTER_ADDR is not set: export MASTER_ADDR and MASTER_PORT (rank 0's "
                      "host and a free port), or give --rendezvous file:PATH or tcp://HOST:PORT",
                      e.source));
  }
  return e;
}

}  // namespace

void check_rendezvous_address(const std::string& a) {
  if (a == "mpi") return;
  if (a.rfind("file:", 0) == 0 && a.size() > 5) return;
  if (a.rfind("tcp://", 0) == 0) {
    const auto colon = a.rfind(':');
    if (colon > 6) {
      const std::string port = a.substr(colon + 1);
      char* end = nullptr;
      const long p = std::strtol(port.c_str(), &end, 10);
      if (!port.empty() && *end == '\0' && p > 0 && p < 65536) return;
    }
  }
  throw UsageError(fmt::format(
      "rendezvous '{}': give file:PATH (a folder every process can write; it must not hold an earlier run's) or "
      "tcp://HOST:PORT (rank 0's host and a free port, where rank 0 listens)",
      a));
}

std::string slurm_first_host(const std::string& list) {
  const auto cut = list.find_first_of(",[");
  if (cut == std::string::npos || list[cut] == ',') return list.substr(0, cut);
  const auto end = list.find_first_of(",-]", cut + 1);  // the first number of the range
  return list.substr(0, cut) + list.substr(cut + 1, end == std::string::npos ? std::string::npos : end - cut - 1);
}

int slurm_tasks_on_node(const std::string& s, int node) {
  int first = 0;
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(pos, end - pos);
    int tasks = 0, repeat = 1;
    if (std::sscanf(item.c_str(), "%d(x%d)", &tasks, &repeat) < 1 || tasks < 1 || repeat < 1)
      throw UsageError(fmt::format("SLURM_STEP_TASKS_PER_NODE={}: not Slurm's form (e.g. 2(x3),1)", s));
    if (node < first + repeat) return tasks;
    first += repeat;
    pos = end + 1;
  }
  throw UsageError(fmt::format("SLURM_NODEID={} is past the nodes of SLURM_STEP_TASKS_PER_NODE={}", node, s));
}

void split_nodes(LaunchEnv& e, int per) {
  if (per < 1 || e.size % per != 0)
    throw UsageError(
        fmt::format("--procs-per-node {}: the {} process{} do not split into nodes of {}; give a divisor "
                    "of {}",
                    per, e.size, e.size == 1 ? "" : "es", per, e.size));
  e.local_size = per;
  e.local_rank = e.rank % per;
  e.node = e.rank / per;
  e.nodes = e.size / per;
  e.nodes_given = true;
}

LaunchEnv discover_launch(const EnvLookup& env, const std::string& flag, bool with_mpi) {
  LaunchEnv e;
  const std::string who = text(env, "STEPBENCH_LAUNCHER");
  const bool pmi = env("PMI_SIZE") || env("PMIX_RANK");
  const bool mpirun = env("OMPI_COMM_WORLD_SIZE") || env("MV2_COMM_WORLD_SIZE");
  // srun's own variables, unless srun started an MPI build through PMI (MPI then says the ranks)
  const bool srun = !mpirun && env("SLURM_STEP_NUM_TASKS") && env("SLURM_PROCID") && !(pmi && with_mpi && flag.empty());
  // torchrun's workers, also under srun or mpirun
  const bool torchrun = env("TORCHELASTIC_RUN_ID") && env("RANK");
  if (who == "stepbench" || torchrun)
    e = from_torchrun(env, who == "stepbench" ? Launcher::stepbench : Launcher::torchrun, flag);
  else if (srun)
    e = from_slurm(env, flag);
  else if (mpirun || pmi)
    e = from_mpi(env, with_mpi, flag);
  else if (env("RANK") || env("WORLD_SIZE"))
    e = from_torchrun(env, Launcher::torchrun, flag);
  else if (!flag.empty())
    throw UsageError(
        fmt::format("--rendezvous {} without a launcher: set RANK and WORLD_SIZE (and LOCAL_RANK, "
                    "LOCAL_WORLD_SIZE) for each process, or start them with stepbench launch",
                    flag));
  if (!who.empty() && who != "stepbench")
    throw UsageError(fmt::format("STEPBENCH_LAUNCHER={}: only stepbench launch sets it (to 'stepbench')", who));
  check(e);
  set_node(env, e);
  return e;
}

}  // namespace stepbench
