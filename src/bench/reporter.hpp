// Google Benchmark's console output as usual, and every repetition of every benchmark kept for the
// summary.
#pragma once
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

namespace stepbench {

class SummaryReporter final : public benchmark::ConsoleReporter {
 public:
  explicit SummaryReporter(OutputOptions opts) : ConsoleReporter(opts) {}
  struct Rep {
    double device_ms;
    std::map<std::string, double> counters;
  };
  std::map<std::string, std::vector<Rep>> reps;  // by registered name
  std::vector<std::string> order;                // registered names in run order
  std::map<std::string, std::string> labels;     // per-layer benchmarks: the model's layers of that shape
  std::vector<std::string> errors;
  std::map<std::string, int> cut_short;  // repetitions not run after a signal or a blow-up (Interrupt), by name

  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> shown;  // the console gets one line per benchmark cut short, not one per repetition
    for (const auto& r : runs) {
      const bool cut = r.error_occurred && (r.error_message.rfind("cut short by ", 0) == 0 ||
                                            r.error_message.rfind("not run: ", 0) == 0);  // Interrupt::message
      if (!cut || ++cut_short[r.run_name.function_name] == 1) shown.push_back(r);
      if (r.error_occurred) {
        if (!cut) errors.push_back(fmt::format("{}: {}", r.run_name.function_name, r.error_message));
        continue;
      }
      if (r.run_type != Run::RT_Iteration) continue;
      Rep rep{r.GetAdjustedRealTime(), {}};  // manual time, in the benchmark's unit (ms)
      for (const auto& [k, c] : r.counters) rep.counters[k] = c.value;
      const std::string& name = r.run_name.function_name;
      if (!reps.count(name)) order.push_back(name);
      if (!r.report_label.empty()) labels[name] = r.report_label;
      reps[name].push_back(std::move(rep));
    }
    if (!shown.empty()) ConsoleReporter::ReportRuns(shown);
  }
};

}  // namespace stepbench
