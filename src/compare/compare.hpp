// stepbench compare: the regression gate. A run is one observation: repetitions inside one process
// share its state, so separate runs differ by more than one run's repetitions do (the run-to-run
// noise), and the verdict is judged with that noise, by the evidence at hand:
//   rounds   ab.sh's interleaved rounds (pooled files with "ab_round"): each round's median paired
//            with the other side's in the same time slot, a one-sided Wilcoxon signed-rank test
//            over the rounds (Holm over the phases), a paired bootstrap interval of the ratio;
//   history  a run against earlier runs of the same machine and configuration (--history): their
//            medians since the last change point give the noise, and a prediction interval (t)
//            says whether HEAD is outside it; change points in each series are found and dated;
//   runs     two lone files: the run-to-run noise is a stated default per backend (or
//            --run-noise), and the change must exceed what two runs move by chance.
// In the last two the within-run U test (Holm) is a necessary condition too. Without enough
// evidence the verdict is "unknown", with the smallest change the comparison could have shown
// (the minimum detectable change) and what to run to decide. When a phase regresses and both runs
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
  std::vector<double> ms;           // one value per repetition (per call of the timed region), milliseconds
  int throttled = 0;                // repetitions during which the GPU was throttled (the "throttled" counter)
  double layers = 1;                // per-layer benchmarks: how many layers of the model have this shape
  std::string label;                // per-layer benchmarks: those layers' names
  std::vector<int> round;           // ab.sh's pooled files: each repetition's round (1..rounds); else empty
  std::vector<double> run_medians;  // a history: each earlier run's median (NaN: not in that run)
  // a history: each earlier run's repetitions and throttled count, oldest first (empty: not in that
  // run); `ms` and `throttled` are then the base window's (compare_runs: the runs since the series'
  // last change point, the last few at most)
  std::vector<std::vector<double>> run_ms;
  std::vector<int> run_throttled;
};

struct HistoryRun {
  std::string revision, time;
};

struct Run {
  std::string source;                          // a file name, or "history (N runs)"
  std::map<std::string, std::string> context;  // Google Benchmark's context with stepbench's keys
  std::map<std::string, Series> benchmarks;    // by key (benchmark_key)
  std::vector<std::string> order;              // keys in file order
  int rounds = 0;                              // ab.sh's pooled files: the rounds per side
  std::vector<HistoryRun> history;             // a history: every matching earlier run, oldest first
  std::size_t history_last = 5;                // a history: the most runs its base window pools (--last)
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
// and configuration equal `head`'s and whose revision differs from it: each benchmark's series, and
// its base window for the within-run test (compare_runs) at most the last `last` of them,
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
  double run_noise = -1;  // the run-to-run noise (relative sd of a run's median); < 0: stated default
  // ab.sh's paired noise: the sd of its rounds' log ratios (head / base medians of one time slot),
  // for the rounds two lone runs or a history would need to decide; < 0: the stated default
  double round_noise = -1;
  bool fail_on_unknown = false;  // exit 1 when a phase's verdict is unknown (or insufficient data)
};

// The stated run-to-run noise for two lone runs of a backend (relative sd of a run's median),
// conservative: the largest measured between runs on a 2-core VM (cpu, 35%); 5% on cuda.
double default_run_noise(const std::string& backend);
// The stated paired noise of ab.sh's rounds for a backend (default_round_noise; evidence.cpp says
// where it was measured): what the advice after two lone runs or a history sizes its rounds with.
double default_round_noise(const std::string& backend);
// The power the advice's rounds are sized for: a change of exactly --threshold found this often.
constexpr double kAdvicePower = 0.8;

enum class Status { regression, suspicious, no_change, improvement, insufficient, unstable, unknown };
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
  double p_slower = 1, p_faster = 1;  // the run-level test's one-sided p-values, Holm-adjusted
  double noise = 0;                   // the noise floor: the larger side's relative spread
  int throttled_base = 0, throttled_head = 0;
  bool per_layer = false;
  std::size_t repetitions_needed = 0;  // insufficient for too few repetitions: how many per side would do
  std::vector<LayerMove> layers;       // regressions (and unstable) of a phase: what moved most
  // the run-level evidence
  std::string evidence;                      // "rounds", "history" or "runs"
  std::size_t runs_base = 0, runs_head = 0;  // rounds, or runs, per side
  double run_noise = 0;                      // the relative run-to-run sd used (runs, history)
  std::string noise_source;                  // where it came from
  double mdc = 0;                            // the smallest change (a fraction) this comparison could show
  // unknown: about how many ab.sh rounds would find a change of --threshold with kAdvicePower, at the
  // paired noise round_noise (the rounds' own spread, or a stated one) from round_noise_source
  std::size_t rounds_needed = 0;
  double round_noise = 0;
  std::string round_noise_source;
};

// A change point in a benchmark's history (the series of its runs' medians, HEAD last if given). It
// needs 3 runs on either side, so a slowdown is dated once 3 runs follow it; until then HEAD is
// judged by the prediction interval of the runs before it.
struct HistoryChange {
  std::string key;
  std::size_t run = 0;         // index of the first run after the change in the series
  std::string revision, time;  // that run's
  double change = 0, lo = 0, hi = 0, p = 1;
};

struct Report {
  std::string base_source, head_source;
  Options options;
  std::vector<Row> rows;               // phases, then per-layer benchmarks
  std::vector<std::string> notes;      // fingerprint or configuration differences, ...
  std::vector<HistoryChange> changes;  // --history: change points of the phases' series
  std::vector<HistoryRun> history;     // --history: the earlier runs compared against, oldest first
  int exit_code() const;               // 1 when a benchmark regressed (or, with fail_on_unknown, a phase is unknown)
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
