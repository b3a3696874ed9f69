// The statistics of the regression gate: the Mann-Whitney U test (as scipy.stats.mannwhitneyu
// computes it), Holm's correction, medians, robust spreads and a bootstrap interval for a ratio of
// medians.
#pragma once
#include <cstdint>
#include <vector>

namespace stepbench::compare {

double median(std::vector<double> v);

// 1.4826 x the median absolute deviation over the median: a robust relative standard deviation
// (0.01 for 1% Gaussian noise); 0 for fewer than two values.
double relative_spread(const std::vector<double>& v);

enum class Alternative { greater, less };  // x tends to be greater (slower) / less than y

struct UTest {
  double u = 0;        // U of x (scipy's statistic: R1 - n1 (n1 + 1) / 2)
  double p = 1;        // one-sided p-value for the alternative
  bool exact = false;  // exact distribution (no ties and a side of at most 8), else normal with ties
};

// scipy.stats.mannwhitneyu(x, y, alternative=..., method="auto", use_continuity=True): exact when
// either sample has at most 8 values and there are no ties, else the normal approximation with the
// tie correction and the continuity correction.
UTest mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y, Alternative alt);
// The same with the method forced (true: exact; ties are then ranked as scipy ranks them).
UTest mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y, Alternative alt, bool exact);

// The smallest one-sided p-value samples of these sizes can reach (1 / C(n1 + n2, n1)).
double smallest_p(std::size_t n1, std::size_t n2);

// Holm's step-down adjusted p-values, in the order given (family-wise error rate).
std::vector<double> holm(const std::vector<double>& p);

struct Interval {
  double lo = 0, hi = 0;
};
// Percentile bootstrap interval of median(head) / median(base) at `confidence`, resampling each
// side with replacement, `resamples` times, from a fixed seed (the same files give the same answer).
Interval bootstrap_median_ratio(const std::vector<double>& base, const std::vector<double>& head, double confidence,
                                int resamples = 2000, std::uint64_t seed = 12345);

}  // namespace stepbench::compare
