// What Google Benchmark reports to: every repetition of every benchmark kept for the summary; on
// the console nothing by default (the summary is the answer), and with --verbose Google
// Benchmark's context and table, its counters printed in their own units. The --json file is Google
// Benchmark's own file reporter, whole either way.
#pragma once
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

namespace stepbench {

class Progress;

class SummaryReporter final : public benchmark::ConsoleReporter {
 public:
  // verbose: Google Benchmark's context and table too. progress (may be null): erased before the
  // table's lines, and told when a benchmark is done.
  SummaryReporter(OutputOptions opts, bool verbose, Progress* progress = nullptr)
      : ConsoleReporter(opts), verbose_(verbose), progress_(progress) {}
  struct Rep {
    double device_ms;
    std::map<std::string, double> counters;
  };
  std::map<std::string, std::vector<Rep>> reps;  // by registered name
  std::vector<std::string> order;                // registered names in run order
  std::map<std::string, std::string> labels;     // per-layer benchmarks: the model's layers of that shape
  std::vector<std::string> errors;
  std::map<std::string, int> cut_short;  // repetitions not run after a signal or a blow-up (Interrupt), by name

  bool ReportContext(const Context& context) override;
  void ReportRuns(const std::vector<Run>& runs) override;

 protected:
  // Google Benchmark's row with the counters as plain numbers (its own prints 0.0063 ms as "6.3m"
  // and a rate named TFLOP/s as "0.2/s").
  void PrintRunData(const Run& run) override;
  void PrintHeader(const Run& run) override;

 private:
  bool verbose_;
  Progress* progress_;
};

// A counter's value for a table: plain digits, no SI suffix (the unit is in the counter's name).
std::string counter_text(double v);

}  // namespace stepbench
