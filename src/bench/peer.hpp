// --peer pytorch / pytorch-compile: the same phases timed by bench/torch_peer.py after stepbench,
// for ratios.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "bench/config.hpp"

namespace stepbench {

struct PeerResult {
  std::map<std::string, double> ms;       // medians per call by phase, in the region `timing` names
  std::map<std::string, double> host_ms;  // medians of the host wall time per call by phase
  std::string timing;                     // "cuda events" (device time, as stepbench's) or "host"
  std::string settings;                   // what decides its numerics: TF32 flags, autocast, threads, ...
  std::string python, torch;              // the interpreter that ran it and its torch version
  // --layer-times on the CPU: per layer (torchvision's module names, which stepbench's layers take),
  // the medians of `layer_steps` steps under PyTorch's profiler
  struct LayerMs {
    double forward_ms = 0, backward_ms = 0;
  };
  std::map<std::string, LayerMs> layers;
  int layer_steps = 0;
  // Its memory (0: not reported): the process's resident memory before the model was built and its
  // peak over the phases, and on CUDA torch.cuda.max_memory_allocated.
  std::size_t baseline_rss = 0, peak_rss = 0, cuda_max_allocated = 0;
  bool empty() const { return ms.empty(); }
};

// The first of `candidates` whose torch and torchvision import and, when `need_cuda`, whose torch
// sees a GPU, and when `need_compile`, has torch.compile; "" when none does, with one line per
// candidate saying why in `why`.
std::string find_peer_python(const std::vector<std::string>& candidates, bool need_cuda, bool need_compile,
                             std::string* why);

// find_peer_python over c.peer_pythons for c's backend and peer kind; "" with the reasons and what
// to change printed on stderr (before minutes of benchmarks: the run stops with a usage error).
std::string choose_peer_python(const BenchConfig& c);

// The peer's medians, run by the interpreter `py`, or an empty result with the reason printed on
// stderr (the run then exits 1). `script_dirs`: the folders to look for bench/torch_peer.py in,
// first match wins. `threads`: stepbench's CPU thread count, handed to the peer (0: its default).
// `layer_steps` > 0: that many profiled steps after the phases, for PeerResult::layers.
PeerResult run_peer(const BenchConfig& c, const std::vector<std::string>& script_dirs, const std::string& py,
                    int threads, int layer_steps = 0);

// Google Benchmark's --benchmark_min_time among `benchmark_args` in seconds (its default, 0.5, when
// absent): the peer's repetitions last as long.
double benchmark_min_time(const std::vector<std::string>& benchmark_args);

}  // namespace stepbench
