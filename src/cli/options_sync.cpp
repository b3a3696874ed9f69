// The towers' and processes' sync flags: the variable-update mode and its settings, the buckets, the
// timeout, where processes meet, and how ranks form nodes and share GPUs.
#include <CLI/CLI.hpp>

#include "cli/flags.hpp"
#include "cli/options.hpp"

namespace stepbench::cli {

void add_sync_flags(CLI::App& app, Options& o) {
  add_enum(app, "--variable-update", o.bench.run.variable_update,
           "replicated, parameter_server, independent, distributed_all_reduce (replicated's all-reduce in two "
           "levels: within each node, across the nodes, back within each node) or distributed_replicated (node "
           "sums pushed to --ps-ranks parameter servers, the new values pulled back)");
  app.add_option("--bucket-mb", o.bucket_mb, "gradient sync bucket size in MiB")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 65536.0));
  app.add_flag("--no-overlap", o.no_overlap,
               "in the step, sync the gradients after backward instead of bucket by bucket during it");
  app.add_option_function<std::string>(
         "--ps-device", [&o](const std::string& s) { o.ps_on_cpu = s == "cpu"; },
         "parameter_server: where the variables live and the update runs: device (tower 0, GPU 0) or cpu "
         "(host memory, as tf_cnn_benchmarks' --local_parameter_device=cpu)")
      ->default_str("device")
      ->check(CLI::IsMember({"device", "cpu"}));
  app.add_option("--ps-ranks", o.ps_ranks,
                 "distributed_replicated: the parameter servers the variables are sharded over, the first process "
                 "of as many nodes (at most one per node)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option_function<std::string>(
         "--cross-replica-sync", [&o](const std::string& s) { o.cross_replica_sync = s == "on"; },
         "parameter_server and distributed_replicated across processes: off makes them asynchronous "
         "(tf_cnn_benchmarks' flag): each worker (a process; a node in distributed_replicated) pushes its gradients "
         "to the servers and pulls whatever they hold, without waiting for the others")
      ->default_str("on")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--sync-timeout-s", o.sync_timeout_s,
                 "a gradient sync not done after this many seconds (a failed or stalled peer) ends the run with a "
                 "message; 0 waits forever")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--rendezvous", o.rendezvous,
                 "processes without MPI meet at file:PATH (a folder all can write) or tcp://HOST:PORT (rank 0 "
                 "listens) [default: the launcher's: stepbench launch, torchrun's MASTER_ADDR, srun's first node]");
  app.add_option("--procs-per-node", o.procs_per_node,
                 "every K consecutive ranks act as one node, whatever the launcher says (to pose as several nodes on "
                 "one machine, e.g. under mpirun) [default: the launcher's nodes]")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--ranks-per-gpu", o.ranks_per_gpu,
                 "cuda: towers (NCCL ranks) sharing each GPU, to run the multi-rank path on fewer GPUs; not scaling "
                 "figures [default: 1; under stepbench launch, as many as the processes need]")
      ->check(CLI::Range(1, 64));
}

}  // namespace stepbench::cli
