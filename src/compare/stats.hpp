// The statistics of the regression gate: the Mann-Whitney U test (as scipy.stats.mannwhitneyu
// computes it), Holm's correction, medians, robust spreads and a bootstrap interval for a ratio of
// medians.
#pragma once
#include <cstddef>
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

// scipy.stats.wilcoxon(d, alternative=..., method="auto") with its defaults (zero_method "wilcox",
// no continuity correction), scipy 1.10: exact when there are at most 50 differences and none is
// zero (ranks of tied |d| averaged, the statistic truncated as scipy does), else the normal
// approximation with the zeros dropped and the tie correction. The statistic is the sum of the
// ranks of the positive differences; greater: d tends to be positive.
struct SignedRank {
  double t = 0;
  double p = 1;
  bool exact = false;
  std::size_t n = 0;  // differences used (non-zero, for the approximation)
};
SignedRank wilcoxon_signed_rank(const std::vector<double>& d, Alternative alt);
// The smallest one-sided p-value n differences can reach (exact: 1 / 2^n).
double smallest_signed_rank_p(std::size_t n);

// The standard normal's CDF and its inverse; Student's t CDF with `df` degrees of freedom and its
// inverse (the regularised incomplete beta function, by continued fraction).
double normal_cdf(double z);
double normal_quantile(double p);
double student_t_cdf(double t, double df);
double student_t_quantile(double p, double df);

// Mean and sample standard deviation (n - 1); NaN standard deviation for fewer than two values.
struct MeanSd {
  double mean = 0, sd = 0;
};
MeanSd mean_sd(const std::vector<double>& v);

struct Interval {
  double lo = 0, hi = 0;
};

// Change points in a series of run medians (logs of them, oldest first), by binary segmentation
// with two statistics, each kept when a permutation test of it (`permutations` shuffles of the
// segment, from `seed`) gives p < alpha / 2: first the split of the segment with the largest
// two-sample t (pooled variance, both sides at least `min_size`): a step, one change point; where
// that finds none, circular binary segmentation's (Olshen et al. 2004) stretch [i, j) inside the
// segment with the largest t against the rest (runs that moved and came back): a change point at
// each end. Then each part again. Under exchangeable runs (no change) a segment gets a change point
// with probability < alpha (the two tests' Bonferroni bound).
struct ChangePoint {
  std::size_t index = 0;  // the first run after the change
  double p = 1;           // the permutation test's p-value
  double change = 0;      // exp(mean after - mean before) - 1, within the segment split
  Interval ratio{};       // the change's interval at `confidence`, as a ratio (Welch's t)
};
std::vector<ChangePoint> change_points(const std::vector<double>& log_x, double alpha, double confidence = 0.95,
                                       std::size_t min_size = 3, int permutations = 999, std::uint64_t seed = 12345);

// A percentile bootstrap interval of exp(median(d)) over the paired differences d (logs of
// head / base per round), resampling the rounds.
Interval bootstrap_paired_median(const std::vector<double>& d, double confidence, int resamples = 2000,
                                 std::uint64_t seed = 12345);
// Percentile bootstrap interval of median(head) / median(base) at `confidence`, resampling each
// side with replacement, `resamples` times, from a fixed seed (the same files give the same answer).
Interval bootstrap_median_ratio(const std::vector<double>& base, const std::vector<double>& head, double confidence,
                                int resamples = 2000, std::uint64_t seed = 12345);

}  // namespace stepbench::compare
