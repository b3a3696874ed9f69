// The typed configuration of a benchmark run: the command line parses and validates it once
// (src/cli); everything below takes it as it is.
#pragma once
#include <array>
#include <atomic>
#include <string>
#include <vector>

#include "data/data.hpp"
#include "tensor/names.hpp"
#include "train/towers.hpp"

namespace stepbench {

// The timed phases, in run order.
enum class Phase { forward, forward_train, forward_backward, step, grad_sync, update, input_pipeline };
constexpr auto enum_names(Phase) {
  return std::array<EnumName<Phase>, 7>{{{Phase::forward, "forward"},
                                         {Phase::forward_train, "forward_train"},
                                         {Phase::forward_backward, "forward_backward"},
                                         {Phase::step, "step"},
                                         {Phase::grad_sync, "grad_sync"},
                                         {Phase::update, "update"},
                                         {Phase::input_pipeline, "input_pipeline"}}};
}

// Where the step's input comes from: a constant batch on the device, a host batch copied every
// step, a folder of JPEG and PNG images, or a record file of make-records (BenchConfig::data_dir).
enum class DataKind { synthetic, synthetic_host, image_folder, records };
constexpr auto enum_names(DataKind) {
  return std::array<EnumName<DataKind>, 4>{{{DataKind::synthetic, "synthetic"},
                                            {DataKind::synthetic_host, "synthetic-host"},
                                            {DataKind::image_folder, "images"},
                                            {DataKind::records, "records"}}};
}

// --decode: where an image folder's JPEG files are decoded and transformed.
enum class DecodeOn { cpu, gpu };
constexpr auto enum_names(DecodeOn) {
  return std::array<EnumName<DecodeOn>, 2>{{{DecodeOn::cpu, "cpu"}, {DecodeOn::gpu, "gpu"}}};
}

// --peer: PyTorch eager, or PyTorch with torch.compile (default mode).
enum class PeerKind { none, pytorch, pytorch_compile };
constexpr auto enum_names(PeerKind) {
  return std::array<EnumName<PeerKind>, 3>{
      {{PeerKind::none, "none"}, {PeerKind::pytorch, "pytorch"}, {PeerKind::pytorch_compile, "pytorch-compile"}}};
}

// --peak and --peak-cache (bench/peak.hpp): the device's GEMM peak the step's FLOP/s is a share of.
enum class PeakMode { automatic, measure, off, given };
struct PeakOptions {
  PeakMode mode = PeakMode::automatic;  // the cached figure, else measured and cached
  double given_tflops = 0;              // PeakMode::given (--peak 989.4: a data sheet's)
  std::string cache;                    // the cache file ("": none, measured every run)
};

struct BenchConfig {
  TowerOptions run;  // backend (resolved), towers per process (--gpus), batch per tower, model, precision, sync
  int warmup = 10;
  int repetitions = 5;
  bool cuda_graph = false;
  std::vector<Phase> phases;  // empty: all
  DataKind data = DataKind::synthetic;
  std::string data_dir;  // image_folder, records: the path
  int data_threads = 2;
  int prefetch = 2;
  InputCache cache = InputCache::none;  // --cache memory (image folders)
  DecodeOn decode = DecodeOn::cpu;      // --decode gpu: nvJPEG and the transforms on each tower's GPU
  std::uint64_t cache_limit_mb = 0;     // --cache-limit-mb (0: 80% of the available memory)
  bool suggest = false;                 // --suggest: try each remedy for the input pipeline (bench/suggest.hpp)
  std::string json;                     // Google Benchmark's JSON goes here ("": none)
  std::string history;                  // --history: one JSON line per run appended here ("": none)
  PeakOptions peak;
  std::string plan_cache;  // --plan-cache: run.plans was loaded from it, and is written back ("": none)
  // The signal the command line's SIGINT/SIGTERM handler stored (0: none yet), polled between
  // benchmarks (bench/interrupt.hpp); null: never interrupted.
  const std::atomic<int>* interrupt = nullptr;
  std::string revision;  // the source revision this binary was built from (git describe), for the context
  bool per_layer = false;
  bool layer_times = false;  // --layer-times: every layer's pieces inside the real step (bench/layer_times)
  std::string trace;         // --trace: the probed steps as a Chrome trace-event file ("": none)
  // --sweep-gpus / --sweep-batch (bench/sweep.hpp): the step over this grid instead of the fixtures;
  // an empty list is the run's own --gpus or --batch-size.
  std::vector<int> sweep_gpus;
  std::vector<std::int64_t> sweep_batch;
  bool sweep() const { return !sweep_gpus.empty() || !sweep_batch.empty(); }
  // --project-gpus (bench/projection.hpp): project the step to these GPU counts from this run's one-GPU
  // step over the link (--link-gbps and --link-latency-us, or the --fabric preset's figures).
  std::vector<int> project_gpus;
  std::string fabric;  // the preset's name, or "" for the given figures
  double link_gbps = 0, link_latency_us = 0;
  // two levels (bench/fabric.hpp): --gpus-per-node G, and the link within a node (--node-fabric or
  // --node-link-gbps/--node-link-latency-us); --fabric-from FILE: an nccl-tests -J run, fitted by
  // resolve() into the link it measured (one host: within a node where G is given; else between)
  int gpus_per_node = 0;
  std::string node_fabric;
  double node_link_gbps = 0, node_link_latency_us = 0;
  std::string fabric_from, fabric_note;  // the file, and what its fit said
  // The slowest tower (bench/straggler.hpp): the summary lists the top `straggler_top` by compute;
  // --slow-tower T:FACTOR or T:Nms holds global tower T (rank x towers + index) at each backward
  // for (FACTOR - 1) x its compute (measured after warm-up) or N ms.
  int straggler_top = 3;
  bool straggler_top_given = false;  // said on the command line: refused where there is nothing to list
  int slow_tower = -1;               // -1: none
  double slow_factor = 0, slow_ms = 0;
  bool list = false;  // print the benchmark names and return
  PeerKind peer = PeerKind::none;
  // the Pythons to try for the peer, in order: the first whose torch and torchvision import (and,
  // on the cuda backend, whose torch sees a GPU) runs it. --peer-python gives exactly one.
  std::vector<std::string> peer_pythons = {"/usr/bin/python3"};
  std::vector<std::string> benchmark_args;  // --benchmark_* flags for Google Benchmark
  std::string reduced_note;                 // non-empty: the reduced CPU default was applied, and how
  bool verbose = false;                     // --verbose: Google Benchmark's context and table on the console too
  bool progress = false;                    // a live progress line on stderr (the command line found it a terminal)

  bool reduced() const { return !reduced_note.empty(); }
  bool data_files() const { return data == DataKind::image_folder || data == DataKind::records; }
  std::string data_name() const { return data_files() ? data_dir : std::string(to_string(data)); }
};

}  // namespace stepbench
