// --layer-times and --trace: after the timed repetitions, the real step runs again with a probe on
// every tower's graph (graph/probe.hpp): every piece of every layer's forward and backward is timed
// by events recorded around it on the tower's stream (device time on a GPU, the steady clock on the
// CPU) and by the host clock around its launches, and every bucket's sync by events on the
// communication stream (Towers::set_sync_timing). NVTX ranges name the same pieces for Nsight.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/feeder.hpp"
#include "train/towers.hpp"

namespace stepbench {

// One piece of work of one probed step on one tower, in ms since the run's origin.
struct ProbeSpan {
  static constexpr int kPhase = -2;  // layer of a phase's span (forward, backward, grad_sync, update)
  int layer;                         // index in Graph::layers(), -1 the graph's own work, or kPhase
  const char* part;                  // GraphProbe's part, or the phase's name
  const char* phase;                 // the phase it ran in
  double dev0, dev1;                 // on the device (the tower's stream)
  double host0, host1;               // the host launching it
};

// One kernel, copy or set the device ran in a probed step (the backend's activity records: CUPTI on
// cuda), in ms since the run's origin, with the piece whose launches it came from.
struct KernelSpan {
  std::string name;
  double t0, t1;
  int layer;          // the piece's ProbeSpan::layer; kUntagged when no piece launched it (NCCL's thread)
  const char* part;   // the piece's part ("" when untagged)
  const char* phase;  // the phase it ran in ("" when untagged)
  std::uint32_t stream;
  static constexpr int kUntagged = -3;
};

// One stage of the input pipeline's work on one of its threads (or its wait for room), in ms since
// the run's origin.
struct InputSpan {
  int thread;
  const char* stage;  // kStageNames', or "wait for room"
  double t0, t1;
};

struct ProbedStep {
  std::vector<std::vector<ProbeSpan>> towers;            // [tower]: in the order they began
  std::vector<std::vector<Towers::BucketSpan>> buckets;  // [tower], ms since the run's origin
  std::vector<std::vector<KernelSpan>> kernels;          // [tower], by start; empty without activity records
  // with a data source (a Feeder): each tower's staging of this step's batch on its copy stream, and
  // what the pipeline's threads did since the last step's end
  std::vector<std::optional<std::pair<double, double>>> staging;  // [tower]
  std::vector<InputSpan> input;
  // the process's sync levels (distributed_all_reduce, distributed_replicated): each call, ms since
  // the run's origin, on the host
  std::vector<LevelSpan> levels;
};

class ProbedRun {
 public:
  // Attaches a probe to every tower's graph and turns the sync timing on; both undone on destruction.
  // activity: also the device's activity records (kernel names), where the backend has them; where
  // it cannot, activity_note() says why and the steps go on without.
  // feeder (may be null): with a data source, each probed step is fed a batch first, as the timed
  // step:data=... steps are, and the staging and the pipeline's threads are traced.
  explicit ProbedRun(Towers& t, bool activity = false, Feeder* feeder = nullptr);
  ~ProbedRun();
  ProbedRun(const ProbedRun&) = delete;
  ProbedRun& operator=(const ProbedRun&) = delete;
  // One training step as Towers::step runs it (overlapped sync included), probed; synchronises.
  ProbedStep step();
  // "CUPTI activity records" when the steps carry kernels, else why not ("" when not asked).
  const std::string& activity_note() const { return activity_note_; }

 private:
  struct Probe;
  Towers& t_;
  std::vector<std::unique_ptr<Probe>> probes_;
  double origin_;             // the steady clock at construction, ms
  Feeder* feeder_ = nullptr;  // active, or null
  bool activity_ = false;
  std::string activity_note_;
};

// After the timed repetitions: one untimed probed step (it makes the events), then `steps` probed
// steps. Every process of an MPI run calls it together (the steps sync gradients). activity: with
// the device's kernels (ProbedRun); *note (if given) gets ProbedRun::activity_note.
std::vector<ProbedStep> run_probed_steps(Towers& t, int steps, bool activity = false, std::string* note = nullptr,
                                         Feeder* feeder = nullptr);

// Medians over the probed steps of tower 0: per layer and piece, per phase, the step, and what the
// pieces leave uncovered. `peak_tflops` (0: unknown) gives a percentage of peak per convolution.
struct LayerTimes {
  struct Row {
    int layer;
    std::string label, kind, part, pass;  // pass: forward, backward
    double ms = 0;                        // median over the steps
    double flops = 0;                     // per step (0: not counted)
    // the library's implementation of this piece where the backend names it: oneDNN's on the CPU
    // ("brgconv:avx512_core_bf16", "jit_bf16:avx512_core_bf16", "gemm:jit"); "" elsewhere
    std::string implementation;
  };
  std::vector<Row> rows;  // in execution order (backward rows in backward order)
  int steps = 0;
  double step_ms = 0, forward_ms = 0, backward_ms = 0, sync_ms = 0, update_ms = 0;
  double parts_ms = 0;      // median over the steps of the sum of every piece, the sync and the update
  double remainder_ms = 0;  // median over the steps of the step minus that sum
  double idle_ms = 0;       // median of the device's gaps between consecutive pieces
  int towers_counted = 1;   // towers whose pieces parts_ms and idle_ms count (all on the CPU: sequential)
  double peak_tflops = 0;
  std::string clock;  // "device events" or "steady clock"
  // From the activity records (kernels > 0): medians over the steps of tower 0's device from its
  // first kernel's start to its last's end, the time some kernel, copy or set ran, and the rest;
  // the largest gaps with the pieces around them; per piece (rows' index) its kernels by time.
  struct Gap {
    double ms = 0;
    int step = 0;
    std::string after, before;  // "layer/part" of the work on either side
  };
  struct Kernel {
    std::string name;
    double ms = 0;  // median over the steps of its time per step in the piece
    int count = 0;  // launches per step
  };
  int kernels = 0;  // per step (median)
  double window_ms = 0, busy_ms = 0, gap_ms = 0;
  int gaps = 0;  // per step (median)
  std::vector<Gap> largest_gaps;
  std::vector<std::vector<Kernel>> row_kernels;  // [row], the largest first
  std::string activity;                          // ProbedRun::activity_note
};
LayerTimes summarize_layer_times(const std::vector<ProbedStep>& steps, const Towers& t, double peak_tflops);
// Fills lt's activity fields from the steps' kernels (no kernels: leaves them empty).
void summarize_activity(LayerTimes& lt, const std::vector<ProbedStep>& steps, const Towers& t);
nlohmann::json layer_times_json(const LayerTimes& lt);
// The summary's section: the step's parts, per kind of work, and the `top` layers by time;
// timed_step_ms (NaN: none), the step's median from the timed repetitions, for the probes' cost.
void print_layer_times(const LayerTimes& lt, int top, double timed_step_ms);

// Dense tensor-core (or FMA for fp32) peak of the device in TFLOP/s for the precision, from its
// name (H100, H200, A100); 0 when unknown (the CPU included).
double device_peak_tflops(const std::string& device_name, const std::string& precision);

// Chrome's trace-event JSON (Perfetto, chrome://tracing): one process per tower (pid = global
// tower index), a device track of phases, layers and pieces, a host track of their launches (not on
// the CPU, where they are the same), and a communication track of the buckets' syncs.
nlohmann::json trace_json(const std::vector<ProbedStep>& steps, const Towers& t, const nlohmann::json& meta);
// Writes j to path (a temporary file, then a rename); Error naming the path when it cannot.
void write_json_file(const std::string& path, const nlohmann::json& j);
// Adds key: v to the top-level object of the JSON file at path (Google Benchmark's --json), as text
// before its closing brace (the file's own formatting, and any NaN it holds, stay); a temporary
// file, then a rename. Error naming the path when it cannot.
void add_to_json_file(const std::string& path, const std::string& key, const nlohmann::json& v);

}  // namespace stepbench
