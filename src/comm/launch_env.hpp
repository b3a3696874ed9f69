// Which launcher started this process, and where it stands among the processes: rank, world size,
// local rank and size, and where the processes meet (the rendezvous). Read from the launchers'
// variables through a lookup the caller gives (the command line passes getenv; the library reads
// no environment itself):
//   stepbench launch   STEPBENCH_LAUNCHER=stepbench, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//                      STEPBENCH_RENDEZVOUS (a file store in a folder the launcher made)
//   mpirun (Open MPI)  OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; MVAPICH: MV2_COMM_WORLD_*;
//                      MPICH/Hydra and PMI launchers: PMI_RANK/PMI_SIZE, PMIX_RANK
//   Slurm (srun)       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                      SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID
//   torchrun           RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//                      (TORCHELASTIC_RUN_ID when torchrun's agent started it)
// MPI ranks meet through MPI; every other launcher through a store (comm/store.hpp) that Gloo uses
// for its rendezvous: `--rendezvous file:PATH` or `tcp://HOST:PORT` when given, else the
// launcher's (stepbench launch: its folder; torchrun: MASTER_ADDR at MASTER_PORT + 1 when torchrun's
// agent holds MASTER_PORT with its own store, MASTER_PORT when the variables were set by hand;
// Slurm: MASTER_ADDR/MASTER_PORT when the job script exported them, else the step's first node
// at a port from the job and step ids).
#pragma once
#include <array>
#include <functional>
#include <string>

#include "tensor/names.hpp"

namespace stepbench {

enum class Launcher { none, stepbench, mpi, slurm, torchrun };
constexpr auto enum_names(Launcher) {
  return std::array<EnumName<Launcher>, 5>{{{Launcher::none, "none"},
                                            {Launcher::stepbench, "stepbench launch"},
                                            {Launcher::mpi, "mpirun"},
                                            {Launcher::slurm, "srun"},
                                            {Launcher::torchrun, "torchrun"}}};
}

struct LaunchEnv {
  Launcher launcher = Launcher::none;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  // The node this process is on, of how many: srun's SLURM_NODEID and SLURM_NNODES; torchrun's
  // GROUP_RANK (stepbench launch --nodes sets it too) with WORLD_SIZE / LOCAL_WORLD_SIZE nodes; else
  // the rank over the processes per node.
  int node = 0, nodes = 1;
  // How the processes find each other: "mpi", or a store address ("file:PATH", "tcp://HOST:PORT");
  // empty for a single process.
  std::string rendezvous;
  // The variables the rank and size came from (for messages: "RANK=1 WORLD_SIZE=2").
  std::string source;
  bool multi() const { return size > 1 || launcher != Launcher::none; }
  bool nodes_given = false;  // split_nodes set the nodes: MPI keeps them rather than finding its own
};

// --procs-per-node K: every K consecutive ranks act as one node (local rank = rank mod K), whatever
// the launcher said. UsageError when K does not divide the processes.
void split_nodes(LaunchEnv& e, int per_node);

// A lookup of the environment: the value, or nullptr when the variable is not set.
using EnvLookup = std::function<const char*(const char*)>;

// The launch this process is part of. rendezvous_flag: the --rendezvous flag's value ("" when not
// given), which overrides the launcher's; with_mpi: whether stepbench was built with MPI (without
// it, mpirun's ranks meet through the store of --rendezvous). Throws UsageError naming the
// variables when they are malformed or disagree (a rank outside the world, a local rank outside the
// node, RANK without WORLD_SIZE, a store address that does not parse, no way to meet).
LaunchEnv discover_launch(const EnvLookup& env, const std::string& rendezvous_flag, bool with_mpi);

// "file:PATH" or "tcp://HOST:PORT" checked; UsageError saying the accepted forms otherwise.
void check_rendezvous_address(const std::string& address);

// The first host of a Slurm host list ("node[07-09,12],gpu1" -> "node07").
std::string slurm_first_host(const std::string& nodelist);
// The task count of node `node` in Slurm's tasks-per-node form ("2(x3),1" -> 2 for nodes 0-2, 1 for node 3).
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace stepbench
