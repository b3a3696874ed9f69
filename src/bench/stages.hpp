// The benchmark run as its stages, in the order run_benchmarks (bench.cpp) calls them:
//
//   set_up            stage_set_up.cpp        the checks that fail fast, the towers, the feeder
//   warm_up           stage_warm_up.cpp       untimed steps; the non-finite check; the JSON context
//   calibrate         stage_stragglers.cpp    --slow-tower: the delay that makes a tower that much slower
//   time_phases       stage_time_phases.cpp   the Google Benchmark fixtures, one per phase
//   measure_peak      stage_peak.cpp          the device's GEMM peak (cached), the step's share of it
//   probe             stage_probe.cpp         the stragglers gathered; --layer-times, --trace,
//                                             --project-gpus: probed steps
//   report_cut_short  stage_report.cpp        a signal or a blow-up: what was measured, said as such
//   keep_run          stage_report.cpp        --history, the plan cache, --suggest, input_stages
//   compare_with_peer stage_peer.cpp          --peer: the same phases in PyTorch
//   report            stage_report.cpp        the summary and the sections the flags asked for
//
// Each stage takes the Run (what set_up built) and the plain results of the stages before it, and
// returns its own. To add a stage: a struct for what it finds, a function here, a file, a line in
// run_benchmarks. Internal to src/bench.
#pragma once
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/config.hpp"
#include "bench/feeder.hpp"
#include "bench/interrupt.hpp"
#include "bench/layer_times.hpp"
#include "bench/memory_report.hpp"
#include "bench/peak.hpp"
#include "bench/peer.hpp"
#include "bench/progress.hpp"
#include "bench/projection.hpp"
#include "bench/reporter.hpp"
#include "bench/run_parts.hpp"
#include "bench/straggler.hpp"
#include "comm/process_group.hpp"
#include "train/towers.hpp"

namespace stepbench {

// A stage's early end of the run: the process exit status (nullopt: go on to the next stage).
using Exit = std::optional<int>;

// Every tower's timeline in every timed step of the step fixture (on with two towers or more over
// the processes): per call of the fixture (a repetition, or Google Benchmark's trial for the
// iteration count), per step, per tower of this process.
struct StragglerLog {
  struct Call {
    std::vector<std::vector<Towers::Timeline>> steps;
    std::vector<double> step_ms;  // the step as timed (the slowest process)
  };
  bool on = false;
  double injected_ms = 0;  // --slow-tower's delay at each backward of its tower
  std::vector<Call> calls;
  void begin_call() {
    if (on) calls.emplace_back();
  }
  void record(const Towers& t, double step_ms);  // after a timed step
};

// The slowest tower, on the root process.
struct Stragglers {
  StragglerInput input;
  StragglerReport report;
};

// What every stage reads: the configuration, the process group, and what set_up built.
struct Run {
  Run(const BenchConfig& config, const ProcessGroup& g, std::vector<std::string> peer_script_dirs);

  const BenchConfig& c;
  const ProcessGroup& group;
  const bool root;           // process 0: the one that reports
  const int gpus;            // towers over every process (names, images/s and the summary count them all)
  const std::string prefix;  // the benchmarks' names: <model>/<precision>/<layout>/gpus:N/batch:B
  const std::vector<std::string> peer_dirs;      // where bench/torch_peer.py may be
  std::vector<Phase> phases;                     // the phases to time, in run order
  std::string trace;                             // --trace ("" none): every process probes, rank 0 writes it
  std::string peer_python;                       // the interpreter that runs --peer ("" none)
  BenchmarkArgv benchmark_argv;                  // Google Benchmark's command line, alive until the run ends
  ResidentMemory resident_before;                // the process's resident memory before the towers were built
  std::optional<ResidentMemory> resident_timed;  // measure_peak's: after the fixtures, before its GEMM
  std::unique_ptr<Towers> towers;
  std::unique_ptr<Feeder> feeder;
  Flops flops{};
  double images = 0;       // per step, over every tower
  bool data_step = false;  // the step:data=... fixture: the step fed by the feeder
  Interrupt stop;          // a signal, or numbers that stopped being finite
  Progress progress;       // the live line on a terminal (off elsewhere and off the root process)
  int fixtures = 0;        // the benchmarks time_phases registered, for the progress line
  StragglerLog stragglers;
  // every timed step of the step fixture, this process's own ms, per call of the fixture (the last
  // --repetitions calls are the repetitions; the earlier ones Google Benchmark's trials)
  std::vector<std::vector<double>> step_samples;
  // the same steps less their wait for the sync (the step's region from the end of backward to the
  // update): what --project-gpus over several processes adds its modelled sync to
  std::vector<std::vector<double>> step_compute_samples;
};

// What time_phases measured.
struct Timings {
  std::unique_ptr<SummaryReporter> reporter;  // every repetition by name, the errors, what was cut short
  std::unique_ptr<std::ostream> devnull;      // the reporter's streams off the root process
  bool json_in_place = false;                 // --json is a FIFO or /dev/stdout: nothing can be added to it
  Exit exit;                                  // the run ends here (no benchmark ran, --json not written)
};

// --cross-replica-sync off: every worker's pace and pushes, and what each server applied.
struct AsyncWorker {
  int rank = 0;           // the process that pushes for it
  int worker = 0;         // its rank, or its node
  double step_ms = 0;     // the median of that process's own timed steps
  double images = 0;      // per step: its towers' batches (a node's: every process's)
  double pushes = 0;      // the steps it pushed since the towers were made (each to every server)
  double pushed_sum = 0;  // the sum of every element it pushed
  double applied = 0;     // the servers' count of its pushed shards
};
struct AsyncServer {
  int rank = 0;  // the process it runs on
  int shard = 0;
  double floats = 0;  // of its shard
  double applied = 0, applied_sum = 0;
  std::vector<double> staleness_counts;  // [i]: the shards applied i of its updates behind it
};
struct AsyncReport {
  bool node_workers = false;         // distributed_replicated: each node one worker
  std::vector<AsyncWorker> workers;  // by worker
  std::vector<AsyncServer> servers;  // by shard
};

// What probe found in the probed steps after the timed repetitions.
struct Probes {
  std::optional<LayerTimes> layer_times;      // --layer-times
  std::optional<ProjectionInput> projection;  // --project-gpus
  Fabric fabric;                              // the fabric --project-gpus projects over
  std::optional<Stragglers> stragglers;       // two towers or more: on the root process
  std::optional<AsyncReport> async;           // --cross-replica-sync off: on the root process
  Peak peak;                                  // measure_peak's, on the root process
  bool failed = false;                        // a probed step threw (said on stderr); the exit status is 1
};

// Shared by the stages: adds key: v to --json on the root process, or says on stderr why it cannot
// (--json is a FIFO or /dev/stdout). Error when the file cannot be rewritten.
void add_json_section(const Run& run, const Timings& t, const std::string& key, const nlohmann::json& v);
// The exit status of a process other than the root, which reports nothing.
int other_process_exit(const Run& run, const Timings& t, const Probes& p);
// The step fixture's median device time over the timed repetitions (NaN: none): the slowest
// process's with several
double timed_step_ms(const Run& run, const Timings& t);

// Google Benchmark's flags, the files the run will write, the peer's Python, then the towers and
// the feeder. Ends the run with 2 on a usage error, with 0 after --list.
Exit set_up(Run& run, const char* argv0);
// --warmup untimed steps (never fewer than one), then the JSON context. Ends the run after a signal
// (nothing was measured) or numbers that stopped being finite.
Exit warm_up(Run& run);
// Registers one fixture per phase (and --cuda-graph's, the input's, --per-layer's) and runs them;
// --json is whole once it returns.
Timings time_phases(Run& run);
// --slow-tower: a few steps measure the tower's compute, then its delay is set (every process
// together). A tower index past the towers is a UsageError.
void calibrate_slow_tower(Run& run);
// The step fixture's timelines, gathered on the root process and analysed (every process together).
std::optional<Stragglers> gather_stragglers(Run& run);
nlohmann::json stragglers_json(const Run& run, const Stragglers& s);  // --json's "stragglers"
// The summary's section: the spread, the slowest and fastest, the cost, the top --straggler-top.
void print_stragglers(std::ostream& out, const Run& run, const Stragglers& s);
// --cross-replica-sync off (stage_async.cpp): every worker's steps and pushes gathered on the root
// process (every process together); its summary lines and --json's "asynchronous".
std::optional<AsyncReport> gather_async(Run& run);
void print_async(std::ostream& out, const Run& run, const AsyncReport& a);
nlohmann::json async_json(const Run& run, const AsyncReport& a);
// The root process's device peak (peak.hpp: --peak, --peak-cache) and --json's "peak" with the
// step's and the forward's share of it; the other processes get none (they report nothing).
Peak measure_peak(Run& run, const Timings& t);
// The summary's "of peak" line ("": --peak off, or neither the step nor the forward was timed).
std::string peak_answer(const Run& run, const Timings& t, const Peak& pk);
// Model FLOP/s per device of a timed phase ("step", "forward"): the median repetition's (NaN: not timed).
double phase_tflops_per_device(const Run& run, const Timings& t, const std::string& phase);
// The stragglers gathered; --layer-times, --trace, --project-gpus: probed steps after the timed
// repetitions (every process together), their results added to --json.
Probes probe(Run& run, const Timings& t, Peak peak);
// After a signal or a blow-up: the summary of what was measured, what was not, and the exit status.
Exit report_cut_short(Run& run, const Timings& t, const Probes& p);
// A whole run: appended to --history, the plan cache saved, --suggest's remedies measured, the
// input stages added to --json.
void keep_run(Run& run, const Timings& t);
// --peer: the same phases in PyTorch (an empty result without --peer, or with the reason on stderr).
PeerResult compare_with_peer(Run& run, const Timings& t, const Probes& p);
// The summary, then the sections the flags asked for; returns the exit status.
int report(Run& run, const Timings& t, const Probes& p, const PeerResult& peer);

}  // namespace stepbench
