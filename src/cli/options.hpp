// The stepbench command line: every flag of the benchmark run, parsed by CLI11 (also from a TOML
// file given with --config), validated, and resolved against the machine (--backend auto, the
// reduced CPU default, --global-batch-size).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stepbench::cli {

struct Options {
  std::string backend = "auto";  // after resolve(): "cpu" or "cuda"
  int gpus = 1;
  std::int64_t batch_size = 0;         // per GPU (tower); 0: not given
  std::int64_t global_batch_size = 0;  // 0: not given
  std::string model = "inception_v3";
  std::int64_t image_size = 299;
  std::string aux_logits = "on";
  std::string precision = "fp32";
  std::string format = "nchw";
  std::string variable_update = "replicated";
  std::string optimizer = "momentum";
  double learning_rate = 0.01;
  double weight_decay = 0.0;
  int warmup = 10;
  int repetitions = 5;
  double bucket_mb = 25.0;
  bool no_overlap = false;
  std::string ps_device = "device";  // parameter_server: device (tower 0) or cpu (host memory)
  double sync_timeout_s = 600.0;
  int workspace_mb = 512;
  bool cuda_graph = false;
  std::vector<std::string> phases;  // empty: all
  std::string data = "synthetic";    // synthetic, synthetic-host, or a JPEG folder
  int data_threads = 2;
  int prefetch = 2;
  std::string json;
  bool per_layer = false;
  bool list = false;  // print the fixture names and exit
  std::string peer;   // "pytorch": time the same phases in PyTorch after stepbench, for ratios
  std::string peer_python = "/usr/bin/python3";
  std::vector<std::string> benchmark_args;  // --benchmark_* flags for Google Benchmark

  // Filled by resolve():
  bool reduced = false;  // the reduced CPU default was applied
  std::string reduced_note;
  std::vector<std::string> explicitly_set;  // flag names given on the command line or in --config
  bool given(const std::string& flag) const;
};

// Every phase in run order.
const std::vector<std::string>& all_phases();

// Parses argv. Returns the exit code to return at once (0 after --help, 2 after a usage error,
// with the message printed to stderr), or nullopt to go on.
std::optional<int> parse(int argc, const char* const* argv, Options& o);

// Resolves --backend auto and the batch flags against the machine; applies the reduced default on
// the CPU when the size flags were not given. Throws UsageError with what to change.
void resolve(Options& o);

}  // namespace stepbench::cli
