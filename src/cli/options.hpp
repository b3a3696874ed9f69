// The stepbench command line: every flag of the benchmark run, parsed by CLI11 (also from a TOML
// file given with --config) straight into the typed BenchConfig, then validated and resolved
// against the machine once (--backend auto, the reduced CPU default, --global-batch-size).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/config.hpp"
#include "cli/flags.hpp"

namespace stepbench::cli {

struct Options {
  BenchConfig bench;  // what the run gets; bench.run is filled from the flags below by resolve()
  ModelFlags model;
  int gpus = 1;                        // towers per process
  std::int64_t batch_size = 0;         // per GPU (tower); 0: not given
  std::int64_t global_batch_size = 0;  // 0: not given
  double learning_rate = 0.01;
  double weight_decay = 0.0;
  double bucket_mb = 25.0;
  bool no_overlap = false;
  bool ps_on_cpu = false;          // --ps-device cpu
  int ps_ranks = 1;                // --ps-ranks
  bool cross_replica_sync = true;  // --cross-replica-sync on|off
  double sync_timeout_s = 600.0;
  std::string rendezvous;     // --rendezvous: where processes without MPI meet ("" : the launcher's)
  int procs_per_node = 0;     // --procs-per-node: consecutive ranks that act as one node; 0: the launcher's nodes
  std::string peak = "auto";  // --peak auto|measure|off|TFLOPS; resolve() types it into bench.peak
  std::string peak_cache;     // --peak-cache ("": the default file; "none": no cache)
  std::string slow_tower;     // --slow-tower T:FACTOR or T:Nms ("": none); resolve() types it into bench
  int ranks_per_gpu = 0;      // --ranks-per-gpu; 0: not given
  int workspace_mb = 512;
  int device_memory_mb = 0;        // 0: what the device has
  std::string data = "synthetic";  // synthetic, synthetic-host, an image folder or a record file
  std::string peer_python;         // --peer-python: the only Python the peer tries
  bool version = false;            // --version: print it and exit
  bool list_models = false;        // --list-models: print the models and exit

  std::vector<std::string> explicitly_set;  // flag names given on the command line or in --config
  bool given(const std::string& flag) const;
};

// Parses argv. Returns the exit code to return at once (0 after --help, 2 after a usage error,
// with the message printed to stderr), or nullopt to go on.
std::optional<int> parse(int argc, const char* const* argv, Options& o);

// Validates the flags together, resolves --backend auto and the batch flags against the machine,
// applies the reduced default on the CPU when the size flags were not given, and fills o.bench.
// local_processes: the processes on this node (their towers take its GPUs together); share_gpus:
// under stepbench launch, more towers than GPUs share them (--ranks-per-gpu chosen) instead of being
// refused. Throws UsageError with what to change.
void resolve(Options& o, int local_processes = 1, bool share_gpus = false);
// options_sync.cpp: --variable-update and its settings, the buckets, the timeout, the rendezvous, nodes
// and GPU sharing, registered (resolve() validates them).
void add_sync_flags(CLI::App& app, Options& o);
// options_stragglers.cpp: --straggler-top and --slow-tower, registered and validated.
void add_straggler_flags(CLI::App& app, Options& o);
void resolve_stragglers(Options& o);
// options_peak.cpp: --peak and --peak-cache, registered and validated (the default cache file from
// XDG_CACHE_HOME or HOME).
void add_peak_flags(CLI::App& app, Options& o);
void resolve_peak_flags(Options& o);
// options_fabric.cpp: --gpus-per-node, --node-*, --fabric-from; resolve_fabric returns whether
// --fabric-from gave the flat (between nodes) link.
void add_fabric_flags(CLI::App& app, Options& o);
bool resolve_fabric(Options& o);

}  // namespace stepbench::cli
