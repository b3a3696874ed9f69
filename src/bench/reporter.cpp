#include "bench/reporter.hpp"

#include <cmath>
#include <sstream>

#include "bench/progress.hpp"

namespace stepbench {

std::string counter_text(double v) {
  const double a = std::fabs(v);
  if (v == 0 || !std::isfinite(v)) return fmt::format("{}", v);
  if (a >= 1e6) return fmt::format("{:.0f}", v);
  if (a >= 100) return fmt::format("{:.1f}", v);
  if (a >= 1) return fmt::format("{:.3f}", v);
  return fmt::format("{:.3g}", v);
}

bool SummaryReporter::ReportContext(const Context& context) {
  name_field_width_ = context.name_field_width;  // ConsoleReporter's own ReportContext would set it
  if (!verbose_) return true;
  std::ostringstream basic;
  PrintBasicContext(&basic, context);
  std::string text = basic.str();
  const std::string debug = "***WARNING*** Library was built as DEBUG. Timings may be affected.\n";
  if (const auto at = text.find(debug); at != std::string::npos)
    text.replace(at, debug.size(),
                 "(Google Benchmark: \"Library was built as DEBUG\". Debian's libbenchmark package is built that "
                 "way; it slows Google Benchmark's own loop, not the regions stepbench times with device events or "
                 "the steady clock.)\n");
  GetOutputStream() << text;
  return true;
}

void SummaryReporter::ReportRuns(const std::vector<Run>& runs) {
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
  if (!verbose_ || shown.empty()) return;
  if (progress_) progress_->clear();
  ConsoleReporter::ReportRuns(shown);
}

void SummaryReporter::PrintHeader(const Run& run) {
  std::string h =
      fmt::format("{:<{}} {:>13} {:>13} {:>10}", "Benchmark", name_field_width_, "Time", "CPU", "Iterations");
  for (const auto& [name, c] : run.counters) h += fmt::format(" {:>{}}", name, std::max<std::size_t>(10, name.size()));
  const std::string rule(h.size(), '-');
  GetOutputStream() << rule << "\n" << h << "\n" << rule << "\n";
}

void SummaryReporter::PrintRunData(const Run& run) {
  auto& out = GetOutputStream();
  out << fmt::format("{:<{}} ", run.benchmark_name(), name_field_width_);
  if (run.error_occurred) {
    out << "ERROR OCCURRED: '" << run.error_message << "'\n";
    return;
  }
  // the coefficient of variation's row is a percentage (Google Benchmark's accumulated "time")
  const bool pct = run.run_type == Run::RT_Aggregate && run.aggregate_unit == benchmark::StatisticUnit::kPercentage;
  const char* unit = benchmark::GetTimeUnitString(run.time_unit);
  if (pct)
    out << fmt::format("{:>13} {:>13} ", fmt::format("{:.2f} %", 100 * run.real_accumulated_time),
                       fmt::format("{:.2f} %", 100 * run.cpu_accumulated_time));
  else
    out << fmt::format("{:>13} {:>13} ", fmt::format("{:.3f} {}", run.GetAdjustedRealTime(), unit),
                       fmt::format("{:.3f} {}", run.GetAdjustedCPUTime(), unit));
  out << fmt::format("{:>10}", run.iterations);
  for (const auto& [name, c] : run.counters) {
    const std::size_t w = std::max<std::size_t>(10, name.size());
    out << fmt::format(" {:>{}}", pct ? fmt::format("{:.2f}%", 100 * c.value) : counter_text(c.value), w);
  }
  if (!run.report_label.empty()) out << " " << run.report_label;
  out << "\n";
}

}  // namespace stepbench
