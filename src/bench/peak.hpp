// The device's peak, what a step's model FLOP/s is a share of: the dense GEMM rate the device
// reaches for the run's precision, measured once on the backend's own GEMM (the fully connected
// op: oneDNN's on the CPU, cuBLAS's GemmEx on a GPU, with the run's math: fp32, TF32, bf16, fp16)
// and cached per machine in a file (--peak-cache), as nvbench gives a kernel's share of peak
// bandwidth and MLPerf papers model FLOPs utilisation. Internal to src/bench.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <string>

#include "backend/backend.hpp"
#include "bench/config.hpp"  // PeakOptions

namespace stepbench {

struct Peak {
  double tflops = 0;         // 0: none (--peak off, or it could not be measured)
  double median_tflops = 0;  // of the measured repetitions (the peak is their best)
  std::string source;        // "measured", "cached", "given", "" (none)
  std::string how;           // "oneDNN's fully connected ... 2048 x 2048 x 2048 fp32, best of 10"
  std::string measured_at;   // the UTC date of the measurement (cached: when it was measured)
  std::string machine;       // the cache's key
  std::string file;          // the cache file read or written ("": none)
  std::string note;          // why there is none, or why the cache was not written
};

// The key of one peak: the backend, its device (the CPU's model and threads, the GPU's name), its
// libraries and ISA (Backend::versions), and the precision.
std::string peak_key(const Backend& b, Precision p);

// Times the backend's fully connected op (y = x W^T + b, N = M = K = n: 2048 on the CPU, 8192 on a
// GPU) after warm-up calls, for at least `min_ms` of repetitions (3 at least, 50 at most); the best
// repetition's TFLOP/s is the peak. Allocates and frees its own memory.
Peak measure_gemm_peak(Backend& b, Precision p, double min_ms = 1000);

// Reads the cache file (a missing file: empty), with every machine's entries. Throws UsageError
// naming the file when it is not a peak cache.
std::map<std::string, nlohmann::json> load_peak_cache(const std::string& path);
// Writes the entries to a temporary file renamed over path; Error when it cannot.
void save_peak_cache(const std::string& path, const std::map<std::string, nlohmann::json>& entries);

// The peak for this run as the options ask: given, off, the cache's entry for this machine, or
// measured (and written to the cache; a cache that cannot be written is said in Peak::note).
Peak resolve_peak(Backend& b, Precision p, const PeakOptions& o);

// --json's "peak": the figure, where it came from, and the step's and forward's share of it
// (model FLOP/s per device over the peak; NaN: that phase was not timed).
nlohmann::json peak_json(const Peak& pk, double step_tflops, double forward_tflops);

}  // namespace stepbench
