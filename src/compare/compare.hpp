// stepbench compare: the regression gate. Two runs' JSON (Google Benchmark's format with
// repetitions, as `stepbench --json` writes it, or ab.sh's pooled rounds), or a run against the
// history of earlier runs on the same machine, compared per benchmark: a one-sided Mann-Whitney U
// test on the repetitions with Holm's correction, the median ratio with a bootstrap interval, a
// noise floor from each side's own spread, and a status. When a phase regresses and both runs
// carry per-layer timings (--per-layer), the layers and directions that moved most are named.
#pragma once
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace stepbench::compare {

// A file that cannot be read or compared (exit 2).
class CompareError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Series {
  std::vector<double> ms;  // one value per repetition (per call of the timed region), milliseconds
  int throttled = 0;       // repetitions during which the GPU was throttled (the "throttled" counter)
  double layers = 1;       // per-layer benchmarks: how many layers of the model have this shape
  std::string label;       // per-layer benchmarks: those layers' names
};

struct Run {
  std::string source;                          // a file name, or "history (N runs)"
  std::map<std::string, std::string> context;  // Google Benchmark's context with stepbench's keys
  std::map<std::string, Series> benchmarks;    // by key (benchmark_key)
  std::vector<std::string> order;              // keys in file order
};

// A benchmark's name without Google Benchmark's "/repeats:N" and "/manual_time" suffixes, so that
// runs with different repetition counts compare.
std::string benchmark_key(const std::string& name);

// Reads `stepbench --json` output (iteration entries; aggregates are ignored). Throws CompareError.
Run load_run(const std::string& path);

// The context keys that identify the machine (a different value: "insufficient data", never a
// regression) and the configuration.
const std::vector<std::string>& fingerprint_keys();
const std::vector<std::string>& configuration_keys();
// Those of `keys` that both contexts hold with different values, as "key A vs B" (a key on one side
// only, e.g. added by a newer revision, is not a difference).
std::vector<std::string> context_differences(const std::map<std::string, std::string>& a,
                                             const std::map<std::string, std::string>& b,
                                             const std::vector<std::string>& keys);

// The records of a --history file (JSON lines written by `stepbench --history`) whose fingerprint
// and configuration equal `head`'s and whose revision differs from it, the last `last` of them,
// pooled into one run. Throws CompareError when the file cannot be read; an empty run when no record
// matches (every benchmark then has insufficient data).
Run load_history(const std::string& path, const Run& head, int last);

// One JSON line for the history: the fingerprint, revision, configuration, and per benchmark the
// repetitions, their median and spread and the throttled count.
std::string history_record(const Run& run, const std::string& time_utc);

struct Options {
  double threshold = 0.02;  // the smallest relative change reported as a regression or improvement
  double alpha = 0.05;      // family-wise error rate (Holm) and 1 - the interval's confidence
  int min_repetitions = 3;
};

enum class Status { regression, suspicious, no_change, improvement, insufficient, unstable };
const char* to_string(Status s);

struct LayerMove {
  std::string key, label, direction;  // direction: forward, backward data, backward filter
  double delta_ms = 0;                // (head - base median) x layers of this shape: the step's change
  double change = 0;                  // relative change of this benchmark
  double share = 0;                   // delta_ms over the phase's change
};

struct Row {
  std::string key;
  Status status = Status::insufficient;
  std::string reason;
  std::size_t n_base = 0, n_head = 0;
  double base_ms = 0, head_ms = 0;    // medians
  double change = 0;                  // head / base - 1
  double ci_lo = 0, ci_hi = 0;        // of the ratio head / base
  double p_slower = 1, p_faster = 1;  // Holm-adjusted one-sided p-values
  double noise = 0;                   // the noise floor: the larger side's relative spread
  int throttled_base = 0, throttled_head = 0;
  bool per_layer = false;
  std::size_t repetitions_needed = 0;  // insufficient for too few repetitions: how many per side would do
  std::vector<LayerMove> layers;       // regressions (and unstable) of a phase: what moved most
};

struct Report {
  std::string base_source, head_source;
  Options options;
  std::vector<Row> rows;           // phases, then per-layer benchmarks
  std::vector<std::string> notes;  // fingerprint or configuration differences, ...
  int exit_code() const;           // 1 when a benchmark regressed, else 0
  // "" or what to rerun when a phase had too few repetitions to decide: "rerun both runs with
  // --repetitions N" (N: the most any row needs).
  std::string rerun_hint() const;
};

Report compare_runs(const Run& base, const Run& head, const Options& o);

// The report as a text table (stdout), GitHub-flavoured markdown (a job summary) and JSON.
std::string format_text(const Report& r);
std::string format_markdown(const Report& r);
std::string format_json(const Report& r);

}  // namespace stepbench::compare
