// The run-level evidence behind stepbench compare's verdicts (compare.hpp says which when): ab.sh's
// paired rounds, a run against its history, two lone runs; the rounds that would decide a change,
// and the change points of a history. Internal to the compare layer.
#pragma once
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "compare/compare.hpp"
#include "compare/stats.hpp"

namespace stepbench::compare {

// A change point in a history must reach this permutation p-value, split between change_points'
// two statistics (alpha / 2 each): a flat series of 30 runs then shows one in well under 1% of cases
// (tests/compare: the noise model's series).
constexpr double kChangeAlpha = 0.005;

// The run-level evidence of one row, before the family's correction.
struct RunEvidence {
  bool usable = false;
  double d = 0;  // log(head / base) at the run level
  double p_slower = 1, p_faster = 1;
  double crit = 0;           // the |d| the family's test needs (log), for the MDC
  Interval ratio{NAN, NAN};  // 1 - alpha interval of head / base
  std::size_t n_base = 0, n_head = 0;
  double noise = 0;  // relative run-to-run sd (runs, history)
  std::string source;
  double rounds_sd = 0;  // rounds: the sd of the rounds' log ratios
};

// ab.sh's rounds: round k of each side ran in the same time slot; their medians' log ratios are the
// paired observations (a signed-rank test, a paired bootstrap interval).
RunEvidence rounds_evidence(const Series& b, const Series& h, int rounds, double alpha, std::size_t family);
// A run against the history: the earlier runs' medians since the last change point give the
// run-to-run noise (fewer than 3: `fallback`); HEAD must fall outside their prediction interval.
RunEvidence history_evidence(const Series& b, double head_ms, double alpha, std::size_t family, double fallback,
                             const std::string& fallback_source);
// Two lone runs: their medians differ by the run-to-run noise of each, sqrt(2) sigma.
RunEvidence runs_evidence(double base_ms, double head_ms, double alpha, std::size_t family, double sigma,
                          const std::string& source);
// A history's base window (Run::history): each benchmark's runs since the last change point of its
// medians (all its runs where there is none), the last base.history_last of them at most; their
// repetitions become the Series' ms and throttled (for the within-run test). Returns, per key, the
// window in words ("runs 9-12 of 12, since the change point at run 9 (rev8)").
std::map<std::string, std::string> pool_since_change(Run& base);
// About how many ab.sh rounds would find a change of `threshold` with probability `power` (the
// advice's kAdvicePower), with rounds whose log ratios spread by `sd`, over a family of `family`
// tests at alpha (evidence.cpp says how); 1000 means more than that.
std::size_t rounds_for(double threshold, double sd, double alpha, std::size_t family, double power = kAdvicePower);
// Change points of each phase's series: the history's run medians, then HEAD's. A slowdown beyond
// the threshold that HEAD sits after (the last change of the series) makes HEAD's row a regression.
std::vector<HistoryChange> history_changes(const Run& base, const Run& head, std::vector<Row>& rows, const Options& o);

}  // namespace stepbench::compare
