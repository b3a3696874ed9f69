// The regression gate: the U test against scipy, Holm, the status rules on synthetic repetitions
// (false alarms and power), fingerprints, throttling, the layers that moved, files and history.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "compare/compare.hpp"
#include "compare/evidence.hpp"
#include "compare/stats.hpp"
#include "support/temp_dir.hpp"

namespace stepbench::compare {
namespace {

using CRun = Run;  // testing::Test has a Run() of its own

// scipy 1.10.1, scipy.stats.mannwhitneyu(x, y, alternative=..., method=...), use_continuity=True
struct ScipyCase {
  std::vector<double> x, y;
  double u, p_greater_auto, p_less_auto, p_exact, p_asymptotic;
};
const std::vector<ScipyCase>& scipy_cases() {
  static const std::vector<ScipyCase> c = {
      {{1.02, 1.05, 1.07, 1.10, 1.11},
       {0.98, 1.00, 1.01, 1.03, 1.04},
       23.0,
       0.015873015873015872,
       0.9920634920634919,
       0.015873015873015872,
       0.01835692818135205},
      {{5.1, 5.3, 5.2, 5.6, 5.0, 5.4, 5.5, 5.9, 5.8, 5.7},
       {5.0, 4.9, 5.2, 5.1, 4.8, 5.3, 4.7, 5.05, 4.95, 5.15},
       89.0,
       0.001780080184235316,
       0.9986070276792159,
       0.0010446210136612613,
       0.001780080184235316},
      {{1, 2, 2, 3, 3, 3, 4},
       {2, 3, 4, 4, 5, 5, 6},
       8.5,
       0.9843697313699247,
       0.021525716364472567,
       0.9868881118881118,
       0.9843697313699247},
      {{10.0, 10.2, 10.1},
       {9.0, 9.1, 9.2, 9.3, 9.4, 9.5, 9.6, 9.7, 9.8, 9.9, 10.05, 10.15},
       33.0,
       0.015384615384615385,
       0.9912087912087912,
       0.015384615384615385,
       0.01817927658639534},
  };
  return c;
}

TEST(CompareStats, MannWhitneyAgreesWithScipy) {
  for (const auto& c : scipy_cases()) {
    const auto g = mann_whitney_u(c.x, c.y, Alternative::greater);
    EXPECT_DOUBLE_EQ(g.u, c.u);
    EXPECT_NEAR(g.p, c.p_greater_auto, 1e-12 * std::max(1.0, c.p_greater_auto) + 1e-14);
    EXPECT_NEAR(mann_whitney_u(c.x, c.y, Alternative::less).p, c.p_less_auto, 1e-12);
    EXPECT_NEAR(mann_whitney_u(c.x, c.y, Alternative::greater, true).p, c.p_exact, 1e-12);
    EXPECT_NEAR(mann_whitney_u(c.x, c.y, Alternative::greater, false).p, c.p_asymptotic, 1e-12);
  }
  // the method scipy's "auto" picks: exact for a side of at most 8 without ties
  EXPECT_TRUE(mann_whitney_u(scipy_cases()[0].x, scipy_cases()[0].y, Alternative::greater).exact);
  EXPECT_FALSE(mann_whitney_u(scipy_cases()[1].x, scipy_cases()[1].y, Alternative::greater).exact);
  EXPECT_FALSE(mann_whitney_u(scipy_cases()[2].x, scipy_cases()[2].y, Alternative::greater).exact);
  EXPECT_TRUE(mann_whitney_u(scipy_cases()[3].x, scipy_cases()[3].y, Alternative::greater).exact);
}

TEST(CompareStats, HolmSmallestPAndMedians) {
  // by hand: sorted 0.01, 0.02, 0.04, 0.30 times 4, 3, 2, 1, running maximum
  const auto a = holm({0.04, 0.01, 0.30, 0.02});
  EXPECT_DOUBLE_EQ(a[1], 0.04);
  EXPECT_DOUBLE_EQ(a[3], 0.06);
  EXPECT_DOUBLE_EQ(a[0], 0.08);
  EXPECT_DOUBLE_EQ(a[2], 0.30);
  EXPECT_DOUBLE_EQ(holm({0.5, 0.6})[1], 1.0);  // 0.5 x 2: exactly 1
  const auto capped = holm({0.6, 0.7});        // 0.6 x 2 = 1.2: capped at 1, and the running maximum holds it
  EXPECT_DOUBLE_EQ(capped[0], 1.0);
  EXPECT_DOUBLE_EQ(capped[1], 1.0);
  EXPECT_DOUBLE_EQ(smallest_p(3, 3), 1.0 / 20);
  EXPECT_DOUBLE_EQ(smallest_p(5, 5), 1.0 / 252);
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_NEAR(relative_spread({99, 100, 101}), 1.4826 * 1 / 100, 1e-12);
  const auto iv = bootstrap_median_ratio({10, 10.1, 9.9, 10, 10.05}, {11, 11.1, 10.9, 11, 11.05}, 0.95);
  EXPECT_GT(iv.lo, 1.05);
  EXPECT_LT(iv.hi, 1.15);
  EXPECT_LE(iv.lo, iv.hi);
}

// scipy 1.10.1: scipy.stats.wilcoxon(d, alternative=...) with its defaults; t and norm from
// scipy.stats; ttest_ind(equal_var=True) and Welch's interval by hand with t.ppf.
TEST(CompareStats, SignedRankTAndNormalAgreeWithScipy) {
  struct Case {
    std::vector<double> d;
    double t, p_greater, p_less;
    bool exact;
  };
  std::vector<double> long_d;  // numpy.round(numpy.linspace(-0.05, 0.12, 55), 4)
  for (int i = 0; i < 55; ++i) long_d.push_back(std::round((-0.05 + 0.17 * i / 54.0) * 1e4) / 1e4);
  const std::vector<Case> cases = {
      {{0.031, 0.012, -0.004, 0.027, 0.045, 0.019, 0.008, -0.011, 0.022}, 41.0, 0.013671875, 0.990234375, true},
      {{0.01, -0.02, 0.03, -0.005, 0.015, -0.012, 0.002}, 16.0, 0.40625, 0.65625, true},
      // tied |d| without a zero: still the exact distribution, at int(39.5) (scipy 1.10.1's choice)
      {{0.02, -0.02, 0.03, 0.01, 0.02, -0.01, 0.04, 0.03, 0.05}, 39.5, 0.02734375, 0.98046875, true},
      // a zero (dropped) and ties: the normal approximation with the tie correction
      {{0.02, 0.02, -0.01, 0.03, 0.05, -0.02, 0.04, 0.01, 0.06, 0.0, 0.07, -0.03},
       54.0,
       0.03055577933768138,
       0.9694442206623186,
       false},
      {long_d, 1268.0, 1.5062654976109001e-05, 0.9999849373450239, false},  // more than 50
  };
  for (const auto& c : cases) {
    const auto g = wilcoxon_signed_rank(c.d, Alternative::greater);
    EXPECT_DOUBLE_EQ(g.t, c.t);
    EXPECT_EQ(g.exact, c.exact);
    EXPECT_NEAR(g.p, c.p_greater, 1e-12);
    EXPECT_NEAR(wilcoxon_signed_rank(c.d, Alternative::less).p, c.p_less, 1e-12);
  }
  EXPECT_DOUBLE_EQ(smallest_signed_rank_p(9), 1.0 / 512);
  EXPECT_NEAR(student_t_quantile(0.975, 4), 2.7764451051977987, 1e-9);
  EXPECT_NEAR(student_t_quantile(0.99, 29), 2.4620213601503833, 1e-9);
  EXPECT_NEAR(student_t_cdf(1.5, 3), 0.8847080673775886, 1e-12);
  EXPECT_NEAR(student_t_cdf(-2.2, 11), 0.025043055490902084, 1e-12);
  EXPECT_NEAR(normal_quantile(0.99), 2.3263478740408408, 1e-9);
  EXPECT_NEAR(normal_cdf(-1.0), 0.15865525393145707, 1e-15);
}

TEST(CompareStats, ChangePointsOnAFixedSeriesAgreeWithScipy) {
  // 8 runs at one level, 6 about 6% slower (logs of the medians)
  const std::vector<double> x = {0.0,   0.01, -0.01, 0.005, -0.004, 0.012, -0.008,
                                 0.002, 0.06, 0.052, 0.071, 0.058,  0.049, 0.066};
  const auto cps = change_points(x, 0.005, 0.995);
  ASSERT_EQ(cps.size(), 1u);
  EXPECT_EQ(cps[0].index, 8u);
  EXPECT_LT(cps[0].p, 0.005);
  // exp(mean after - mean before) - 1 and Welch's 99.5% interval (scipy.stats.t.ppf, df 10.69)
  EXPECT_NEAR(cps[0].change, 0.06020080974053199, 1e-12);
  EXPECT_NEAR(cps[0].ratio.lo, 1.0438764620800507, 1e-9);
  EXPECT_NEAR(cps[0].ratio.hi, 1.0767804407953812, 1e-9);
  // nothing in a flat series, nothing in one too short to split
  EXPECT_TRUE(change_points({0.01, -0.01, 0.0, 0.02, -0.02, 0.01, 0.0, -0.01, 0.015, -0.005}, 0.005).empty());
  EXPECT_TRUE(change_points({0.0, 0.1, 0.2, 0.3, 0.4}, 0.005).empty());
}

const std::string kPrefix = "tiny/fp32/nchw/gpus:1/batch:16";

// Repetitions with within-run noise only; `offset` scales the whole run (a run-level offset).
CRun synthetic(std::mt19937_64& rng, int reps, double noise, double step_factor, const std::string& device = "cpu0",
               double offset = 1.0) {
  CRun r;
  r.source = "synthetic";
  r.context = {{"backend", "cpu"}, {"device", device}, {"model", "tiny"}, {"precision", "fp32"}};
  std::normal_distribution<double> n(0, 1);
  const std::vector<std::pair<std::string, double>> phases = {
      {"forward", 3.0}, {"forward_train", 3.5}, {"forward_backward", 9.0}, {"step", 10.0}, {"update", 0.5}};
  for (const auto& [ph, ms] : phases) {
    const std::string key = kPrefix + "/" + ph;
    r.order.push_back(key);
    for (int i = 0; i < reps; ++i)
      r.benchmarks[key].ms.push_back(offset * ms * (ph == "step" ? step_factor : 1.0) * (1 + noise * n(rng)));
  }
  return r;
}

// The noise of real runs: each run of the binary moves all its phases together by a run-level
// factor, each phase by a little more on its own, and each repetition by the within-run spread.
// `typical`: the issue's measurements on a 2-core EPYC (consecutive runs 4-8% apart, within-run cv
// 1-5%): run sd 4%, 1% more per phase, 2% within. `bimodal`: this machine on 2026-11-28 (tiny, 5
// repetitions): runs at 16.3 or 24.3 ms (3 of 8 slow), 1.5% within. `measured`: each run's level
// drawn from the forward and step medians (ms) of 70 lone runs in a row of tiny (batch 4, 32x32, 5
// and 8 repetitions) on a 2-core EPYC VM on 2026-11-29, whose host moved it between speeds: 0.9
// to 3.9 ms steps, a 4.7x between two runs of one binary.
struct NoiseModel {
  double run = 0.04, phase = 0.01, within = 0.02;
  double slow_mode = 1.0, slow_share = 0;  // bimodal: a run is slow_mode times slower with this chance
  bool measured = false;                   // the levels of kMeasuredRuns instead
};
const NoiseModel kTypical{};
const NoiseModel kBimodal{0.01, 0.005, 0.015, 1.49, 3.0 / 8};
const NoiseModel kMeasured{0, 0, 0.02, 1.0, 0, true};
const std::vector<std::pair<double, double>> kMeasuredRuns = {
    {0.464, 1.393}, {0.589, 2.274}, {0.420, 1.245}, {0.425, 1.280}, {0.598, 2.087}, {0.531, 1.816}, {0.432, 1.285},
    {0.418, 1.281}, {0.457, 0.866}, {0.349, 1.042}, {0.362, 0.901}, {0.415, 1.214}, {0.443, 1.312}, {0.434, 1.264},
    {0.422, 1.186}, {0.542, 1.534}, {0.457, 1.232}, {0.432, 1.279}, {0.514, 1.730}, {0.462, 1.350}, {0.618, 2.225},
    {0.628, 2.264}, {0.583, 2.049}, {0.592, 2.065}, {0.651, 2.044}, {0.426, 1.263}, {0.449, 1.330}, {0.431, 1.262},
    {0.396, 1.363}, {0.550, 1.992}, {0.550, 2.145}, {0.398, 1.186}, {0.406, 1.008}, {0.444, 1.275}, {0.455, 1.284},
    {0.410, 0.908}, {0.433, 1.286}, {0.432, 1.275}, {0.384, 0.841}, {0.460, 1.320}, {0.469, 1.293}, {0.499, 1.302},
    {0.457, 1.392}, {0.451, 1.325}, {0.446, 1.324}, {0.446, 1.251}, {0.453, 1.344}, {0.459, 1.361}, {0.458, 1.337},
    {0.447, 1.332}, {0.445, 1.372}, {0.614, 2.179}, {0.610, 2.243}, {0.524, 1.763}, {0.593, 2.041}, {0.441, 1.370},
    {0.419, 1.268}, {0.575, 2.075}, {0.509, 2.714}, {1.210, 3.918}, {1.025, 3.345}, {0.974, 3.587}, {0.649, 2.573},
    {0.618, 1.800}, {0.544, 1.868}, {0.604, 1.878}, {0.560, 1.836}, {0.629, 2.120}, {0.489, 1.484}, {0.428, 1.285}};

const char* model_name(const NoiseModel* m) {
  return m == &kTypical ? "typical" : m == &kBimodal ? "bimodal" : "measured";
}

CRun model_run(std::mt19937_64& rng, int reps, const NoiseModel& m, double step_factor) {
  std::normal_distribution<double> n(0, 1);
  std::uniform_real_distribution<double> u(0, 1);
  double offset = std::exp(m.run * n(rng));
  if (u(rng) < m.slow_share) offset *= m.slow_mode;
  double forward_offset = offset;
  if (m.measured) {  // this run's levels relative to the runs' typical ones (0.45 ms forward, 1.3 ms step)
    const auto& at = kMeasuredRuns[std::uniform_int_distribution<std::size_t>(0, kMeasuredRuns.size() - 1)(rng)];
    forward_offset = at.first / 0.45;
    offset = at.second / 1.3;
  }
  CRun r;
  r.source = "model";
  r.context = {{"backend", "cpu"}, {"device", "cpu0"}, {"model", "tiny"}, {"precision", "fp32"}};
  for (const auto& [ph, ms] :
       std::vector<std::pair<std::string, double>>{{"forward", 3.0}, {"forward_backward", 9.0}, {"step", 10.0}}) {
    const std::string key = kPrefix + "/" + ph;
    r.order.push_back(key);
    const double level = ms * (ph == "forward" ? forward_offset : offset) * std::exp(m.phase * n(rng)) *
                         (ph == "step" ? step_factor : 1.0);
    for (int i = 0; i < reps; ++i) r.benchmarks[key].ms.push_back(level * (1 + m.within * n(rng)));
  }
  return r;
}

// Rounds of ab.sh, pooled as it pools them: round k's repetitions tagged k on both sides.
std::pair<CRun, CRun> model_rounds(std::mt19937_64& rng, int rounds, int reps, const NoiseModel& m, double head_step) {
  CRun base, head;
  for (int k = 1; k <= rounds; ++k)
    for (auto* side : {&base, &head}) {
      const CRun one = model_run(rng, reps, m, side == &head ? head_step : 1.0);
      side->context = one.context;
      side->order = one.order;
      for (const auto& [key, s] : one.benchmarks)
        for (double v : s.ms) {
          side->benchmarks[key].ms.push_back(v);
          side->benchmarks[key].round.push_back(k);
        }
    }
  base.rounds = head.rounds = rounds;
  return {base, head};
}

Status step_status(const Report& rep) {
  for (const auto& r : rep.rows)
    if (r.key == kPrefix + "/step") return r.status;
  return Status::insufficient;
}

TEST(CompareGate, TwoLoneRunsOfOneBinaryAreNotCalledARegression) {
  // 1,000 seeded A/A pairs under each model, the stated default noise (cpu: 35%): the issue's
  // target is at most 5% of pairs called a regression
  const auto aa_alarms = [](const NoiseModel& m, std::uint64_t seed, const Options& o, int* unknown) {
    std::mt19937_64 rng(seed);
    int alarms = 0;
    for (int t = 0; t < 1000; ++t) {
      const Report rep = compare_runs(model_run(rng, 5, m, 1.0), model_run(rng, 5, m, 1.0), o);
      alarms += rep.exit_code();
      if (unknown != nullptr) *unknown += step_status(rep) == Status::unknown;
    }
    return alarms;
  };
  for (const NoiseModel* m : {&kTypical, &kBimodal, &kMeasured}) {
    int unknown = 0;
    const int alarms = aa_alarms(*m, m == &kTypical ? 45 : m == &kBimodal ? 46 : 47, Options{}, &unknown);
    std::cout << model_name(m) << " noise: " << alarms << " of 1000 A/A pairs of lone runs called a regression, "
              << unknown << " unknown\n";
    EXPECT_LE(alarms, 50) << alarms << " false alarms in 1000 pairs (" << model_name(m) << ")";
    EXPECT_GT(unknown, 900) << "two lone runs cannot decide 2%: unknown, not no change";
  }
  // the stated noise of before, 20%, was the largest of 8 runs; the measured runs cry wolf at it
  Options old_default;
  old_default.run_noise = 0.20;
  const int at_20 = aa_alarms(kMeasured, 47, old_default, nullptr);
  std::cout << "measured noise, the old stated 20%: " << at_20 << " of 1000 A/A pairs called a regression\n";
  EXPECT_GT(at_20, 50) << "the measured runs do not tell a stated noise of 20% from 35%";
  // the old gate (the U test on the repetitions alone, as if runs did not differ) failed this: with
  // the run noise set to 0 the same pairs are called regressions far more often than 5%
  std::mt19937_64 rng(45);
  Options naive;
  naive.run_noise = 0;
  int alarms = 0;
  for (int t = 0; t < 200; ++t)
    alarms += compare_runs(model_run(rng, 5, kTypical, 1.0), model_run(rng, 5, kTypical, 1.0), naive).exit_code();
  std::cout << "with no run-to-run noise (the old gate's assumption): " << alarms << " of 200 A/A pairs called a "
            << "regression\n";
  EXPECT_GT(alarms, 40) << "the noise model is not noisy enough to tell the old gate from the new";
}

// The step's interval on the ratio (a bootstrap of the paired rounds' median): whether it holds the
// true ratio, and its width.
void interval_of_the_step(const Report& rep, double truth, int& covered, std::vector<double>& widths) {
  for (const auto& r : rep.rows)
    if (r.key == kPrefix + "/step") {
      covered += r.ci_lo <= truth && truth <= r.ci_hi;
      widths.push_back(r.ci_hi / r.ci_lo - 1);
    }
}

TEST(CompareGate, InterleavedRoundsArePairedAndFindATenPercentSlowdown) {
  // 1,000 A/A sets of 9 rounds: at most 5% called a regression (the signed-rank test is exact)
  int covered[2] = {0, 0};  // A/A (typical noise), 10% slower
  std::vector<double> widths[2];
  for (const NoiseModel* m : {&kTypical, &kBimodal, &kMeasured}) {
    std::mt19937_64 rng(m == &kTypical ? 9 : m == &kBimodal ? 10 : 12);
    int alarms = 0;
    for (int t = 0; t < 1000; ++t) {
      const auto [b, h] = model_rounds(rng, 9, 3, *m, 1.0);
      const Report rep = compare_runs(b, h, Options{});
      alarms += rep.exit_code();
      if (m == &kTypical) interval_of_the_step(rep, 1.0, covered[0], widths[0]);
    }
    std::cout << model_name(m) << " noise: " << alarms << " of 1000 A/A sets of 9 rounds called a regression\n";
    EXPECT_LE(alarms, 50) << alarms << " false alarms in 1000 interleaved sets";
  }
  // a 10% slower step: found in at least 90% of 9-round sets (the typical noise)
  // and the interval on the ratio holds the true 1.10 in most sets (the true 1.00 in most A/A sets),
  // at most 15% wide in the median set
  std::mt19937_64 rng(11);
  int found = 0, others = 0;
  for (int t = 0; t < 1000; ++t) {
    const auto [b, h] = model_rounds(rng, 9, 3, kTypical, 1.10);
    const Report rep = compare_runs(b, h, Options{});
    for (const auto& r : rep.rows) (r.key == kPrefix + "/step" ? found : others) += r.status == Status::regression;
    interval_of_the_step(rep, 1.10, covered[1], widths[1]);
  }
  std::cout << "a 10% slower step: found in " << found << " of 1000 sets of 9 rounds; " << others
            << " unchanged phases called a regression\n";
  EXPECT_GE(found, 900) << found << " of 1000";
  EXPECT_LE(others, 50);
  for (int k : {0, 1}) {
    const double width = median(widths[k]);
    std::cout << (k ? "10% slower" : "A/A") << ": the step's interval holds the true ratio in " << covered[k]
              << " of 1000 sets; median width " << 100 * width << "%\n";
    EXPECT_GE(covered[k], 850) << (k ? "10% slower" : "A/A");
    EXPECT_GT(width, 0.0);
    EXPECT_LT(width, 0.15);
  }
  // one set, read as a person would: paired rounds, the interval, what the rounds could show
  const auto [b, h] = model_rounds(rng, 9, 3, kTypical, 1.10);
  const Report rep = compare_runs(b, h, Options{});
  const Row& step = rep.rows[2];
  EXPECT_EQ(step.evidence, "rounds");
  EXPECT_EQ(step.runs_base, 9u);
  EXPECT_GT(step.mdc, 0.0);
  EXPECT_LT(step.mdc, 0.10);
  EXPECT_LT(step.ci_lo, step.ci_hi);
  EXPECT_NE(format_text(rep).find("interleaved rounds, each paired"), std::string::npos) << format_text(rep);
  // too few rounds for the family: insufficient, with the rounds that would do
  const auto [b3, h3] = model_rounds(rng, 4, 3, kTypical, 1.5);
  const Report few = compare_runs(b3, h3, Options{});
  EXPECT_EQ(few.exit_code(), 0);
  EXPECT_EQ(step_status(few), Status::insufficient);
  EXPECT_NE(few.rerun_hint().find("--rounds"), std::string::npos) << few.rerun_hint();
}

// A history as load_history gives it, from the noise model's runs: every run's median and
// repetitions per phase, oldest first.
CRun model_history(std::mt19937_64& rng, int runs, int reps, const NoiseModel& m) {
  CRun h;
  h.source = "history (model)";
  for (int i = 0; i < runs; ++i) {
    const CRun r = model_run(rng, reps, m, 1.0);
    h.context = r.context;
    h.order = r.order;
    h.history.push_back({fmt::format("rev{}", i), "t"});
    for (const auto& [key, s] : r.benchmarks) {
      Series& b = h.benchmarks[key];
      b.run_medians.push_back(median(s.ms));
      b.run_ms.push_back(s.ms);
      b.run_throttled.push_back(0);
    }
  }
  return h;
}

// A run against its history when nothing changed: HEAD and every earlier run drawn alike, each with
// its own run offset (lognormal at the cpu's stated 35%, and the typical model's 4%): over 1000
// series of 4, 6 and 10 earlier runs, at most alpha of them called a regression. Few runs
// are where the prediction interval's width matters: with the mean's standard error sd / sqrt(n)
// instead of the prediction's sd sqrt(1 + 1/n), or z's quantile instead of t's with n - 1 degrees of
// freedom, the same series alarm two to ten times as often (the threshold, 2%, decides nothing at
// this noise).
TEST(CompareGate, ARunAgainstAnUnchangedHistoryIsARegressionAtMostAlphaOfTheTime) {
  const NoiseModel cpu_runs{0.35, 0.01, 0.02};  // the cpu's stated run-to-run noise, lognormal
  for (const NoiseModel* m : {&cpu_runs, &kTypical})
    for (int runs : {4, 6, 10}) {
      std::mt19937_64 rng(runs * 100 + (m == &kTypical ? 1 : 2));
      int alarms = 0;
      for (int t = 0; t < 1000; ++t) {
        const Report rep = compare_runs(model_history(rng, runs, 5, *m), model_run(rng, 5, *m, 1.0), Options{});
        alarms += rep.exit_code();
      }
      const char* name = m == &kTypical ? "typical" : "cpu (35%)";
      std::cout << name << " run noise, " << runs << " earlier runs: " << alarms
                << " of 1000 unchanged HEADs called a regression\n";
      // alpha 5% of 1000 series, and 3 standard deviations of a binomial count for chance
      EXPECT_LE(alarms, 50 + 3 * 7) << alarms << " of 1000 (" << name << ", " << runs << " runs)";
    }
}

// ab.sh's rounds share their time slot: round k of both sides ran within seconds, on a machine whose
// speed drifts by far more than the change between them (here each round's slot moves both sides by
// a factor of spread 35%, the cpu's run-to-run noise; each side's own run adds 1%). Paired by round,
// the slots cancel: unchanged sides are a regression in at most 5% of 1000 sets of 9 rounds, a 5%
// slower step is found in at least 90%. Unpaired (the round medians as two samples), or paired with
// the wrong round (base k with head k + 1), the slots' drift swamps the 5%.
std::pair<CRun, CRun> slot_rounds(std::mt19937_64& rng, int rounds, double slot_sd, double head_step) {
  const NoiseModel side{0.01, 0.002, 0.01};
  std::normal_distribution<double> n(0, 1);
  CRun base, head;
  for (int k = 1; k <= rounds; ++k) {
    const double slot = std::exp(slot_sd * n(rng));  // this round's speed, for both sides
    for (auto* s : {&base, &head}) {
      const CRun one = model_run(rng, 3, side, s == &head ? head_step : 1.0);
      s->context = one.context;
      s->order = one.order;
      for (const auto& [key, series] : one.benchmarks)
        for (double v : series.ms) {
          s->benchmarks[key].ms.push_back(slot * v);
          s->benchmarks[key].round.push_back(k);
        }
    }
  }
  base.rounds = head.rounds = rounds;
  return {base, head};
}

TEST(CompareGate, PairedRoundsCancelTheirSlotsDrift) {
  std::mt19937_64 rng(21);
  int alarms = 0, found = 0;
  for (int t = 0; t < 1000; ++t) {
    const auto [b, h] = slot_rounds(rng, 9, 0.35, 1.0);
    alarms += compare_runs(b, h, Options{}).exit_code();
    const auto [b5, h5] = slot_rounds(rng, 9, 0.35, 1.05);
    found += step_status(compare_runs(b5, h5, Options{})) == Status::regression;
  }
  std::cout << "rounds drifting by 35%: " << alarms << " of 1000 A/A sets called a regression, a 5% slower step "
            << "found in " << found << "\n";
  EXPECT_LE(alarms, 50 + 3 * 7);
  EXPECT_GE(found, 900);
}

TEST(CompareGate, LoneRunsSayUnknownWithWhatTheyCouldShowAndWhatToRun) {
  std::mt19937_64 rng(7);
  const CRun a = synthetic(rng, 10, 0.01, 1.0), b = synthetic(rng, 10, 0.01, 1.05);
  const Report rep = compare_runs(a, b, Options{});
  EXPECT_EQ(rep.exit_code(), 0);
  const Row& step = rep.rows[3];
  EXPECT_EQ(step.status, Status::unknown);
  EXPECT_NEAR(step.run_noise, 0.35, 1e-12);
  // z(1 - 0.05 / 5) x sqrt(2) x 35%: what two lone runs can show
  EXPECT_NEAR(step.mdc, std::expm1(normal_quantile(0.99) * std::sqrt(2.0) * 0.35), 1e-9);
  EXPECT_NE(step.reason.find("the stated default for cpu, 35.0%"), std::string::npos) << step.reason;
  // what would decide it: ab.sh's rounds at the stated paired noise of its rounds (13% on the cpu, from
  // ab.sh A/A rounds; not the run noise times sqrt(2): 49%, which said "more than 1000"), sized for
  // 80% power at 2% over the 5 phases: 457 rounds; at a given --round-noise of 2%, 14
  EXPECT_NE(rep.rerun_hint().find("at a paired noise of 13.0% (the stated default of ab.sh's rounds for cpu"),
            std::string::npos)
      << rep.rerun_hint();
  EXPECT_NE(rep.rerun_hint().find("--rounds 457 "), std::string::npos) << rep.rerun_hint();
  Options given;
  given.round_noise = 0.02;
  const Report r14 = compare_runs(a, b, given);
  EXPECT_NE(r14.rerun_hint().find("--rounds 14 "), std::string::npos) << r14.rerun_hint();
  EXPECT_NE(r14.rerun_hint().find("at a paired noise of 2.0% (--round-noise)"), std::string::npos) << r14.rerun_hint();
  Options two;
  two.run_noise = 0.02;
  const Report r2 = compare_runs(a, synthetic(rng, 10, 0.01, 1.03), two);
  EXPECT_EQ(r2.rows[3].status, Status::unknown);
  EXPECT_NE(r2.rerun_hint().find("scripts/ab.sh BASE HEAD --rounds"), std::string::npos) << r2.rerun_hint();
  Options fail;
  fail.fail_on_unknown = true;
  EXPECT_EQ(compare_runs(a, b, fail).exit_code(), 1);
  // insufficient data is undecided too under --fail-on-unknown (3 repetitions: Holm cannot reach)
  EXPECT_EQ(compare_runs(synthetic(rng, 3, 0.01, 1.0), synthetic(rng, 3, 0.01, 1.0), fail).exit_code(), 1);
  EXPECT_EQ(compare_runs(synthetic(rng, 3, 0.01, 1.0), synthetic(rng, 3, 0.01, 1.0), Options{}).exit_code(), 0);
  // beyond a stated 1% run noise, but repetitions that spread by 30% overlap: unknown, not no change
  Options one;
  one.run_noise = 0.01;
  const Report overlap = compare_runs(synthetic(rng, 5, 0.30, 1.0), synthetic(rng, 5, 0.30, 1.0, "cpu0", 1.10), one);
  bool said = false;
  for (const auto& r : overlap.rows) {
    EXPECT_NE(r.status, Status::regression) << r.key << ": " << r.reason;
    said = said || r.reason.find("repetitions overlap") != std::string::npos;
  }
  EXPECT_TRUE(said) << format_text(overlap);
  // a stated noise of 1% (--run-noise 1): the 5% is a regression; beyond the stated 35%, so is 4x (+300%)
  Options quiet;
  quiet.run_noise = 0.01;
  EXPECT_EQ(compare_runs(a, b, quiet).rows[3].status, Status::regression);
  EXPECT_EQ(compare_runs(a, synthetic(rng, 10, 0.01, 4.0), Options{}).rows[3].status, Status::regression);
  // the report: verdict first, rows by phase under a shared header, 100 columns
  const std::string text = format_text(rep);
  EXPECT_EQ(text.rfind("stepbench compare: no regression", 0), 0u) << text;
  EXPECT_NE(text.find("benchmarks: " + kPrefix + "/..."), std::string::npos) << text;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 100u + 2) << line;  // ± is 2 bytes
}

// The rounds the advice names (rounds_for): the one-sided t test's power at the threshold, over the
// family, on t quantiles, then over the signed-rank test's efficiency; these counts are scipy's (its
// t.ppf through the same formula).
TEST(CompareGate, TheAdvisedRoundsArePinned) {
  EXPECT_EQ(rounds_for(0.02, 0.02, 0.05, 5), 14u);
  EXPECT_EQ(rounds_for(0.02, 0.03, 0.05, 5), 28u);
  EXPECT_EQ(rounds_for(0.05, 0.03, 0.05, 5), 8u);
  EXPECT_EQ(rounds_for(0.02, 0.05, 0.05, 3), 62u);
  EXPECT_EQ(rounds_for(0.10, 0.35, 0.05, 5), 145u);
  EXPECT_EQ(rounds_for(0.02, 0.13, 0.05, 5), 457u);
  EXPECT_EQ(rounds_for(0.02, 0.35, 0.05, 5), 1000u);  // more than anyone runs: "more than 1000"
}

// Rounds whose paired log ratios are normal with sd 3% around a change of exactly the threshold (2%):
// with the rounds the advice names for them (25 over 3 phases) the signed-rank test finds the change
// (p below alpha after Holm) in at least 80% of sets; with the rounds at which the detectable change
// only equals the threshold (14, the advice before) about half the time.
TEST(CompareGate, TheAdvisedRoundsFindAChangeOfTheThresholdWithTheirPower) {
  const auto rounds_with = [](std::mt19937_64& rng, int rounds, double sd, double change) {
    std::normal_distribution<double> n(0, 1);
    CRun base, head;
    for (auto* s : {&base, &head}) s->context = {{"backend", "cpu"}, {"device", "cpu0"}, {"model", "tiny"}};
    for (const char* ph : {"forward", "forward_backward", "step"}) {
      const std::string key = kPrefix + "/" + ph;
      base.order.push_back(key);
      head.order.push_back(key);
      for (int k = 1; k <= rounds; ++k) {
        const double slot = 10 * std::exp(0.3 * n(rng));  // the round's own speed, shared
        base.benchmarks[key].ms.push_back(slot);
        head.benchmarks[key].ms.push_back(slot * std::exp(std::log1p(change) + sd * n(rng)));
        base.benchmarks[key].round.push_back(k);
        head.benchmarks[key].round.push_back(k);
      }
    }
    base.rounds = head.rounds = rounds;
    return std::make_pair(base, head);
  };
  const std::size_t advised = rounds_for(0.02, 0.03, 0.05, 3);
  EXPECT_EQ(advised, 25u);
  std::mt19937_64 rng(33);
  for (const int rounds : {static_cast<int>(advised), 14}) {
    int found = 0;
    for (int t = 0; t < 400; ++t) {
      const auto [b, h] = rounds_with(rng, rounds, 0.03, 0.02);
      for (const auto& r : compare_runs(b, h, Options{}).rows) found += r.key == kPrefix + "/step" && r.p_slower < 0.05;
    }
    std::cout << rounds << " rounds: a change of exactly the threshold found in " << found << " of 400 sets\n";
    if (rounds == static_cast<int>(advised)) {
      EXPECT_GE(found, 320 - 3 * 8) << found << " of 400";  // 80%, less 3 sd of a binomial count
    }
  }
}

TEST(CompareGate, DifferentMachinesOrTooFewRepetitionsAreInsufficientData) {
  std::mt19937_64 rng(1);
  const CRun a = synthetic(rng, 10, 0.01, 1.0), b = synthetic(rng, 10, 0.01, 1.5, "cpu1");
  const Report rep = compare_runs(a, b, Options{});
  EXPECT_EQ(rep.exit_code(), 0);
  ASSERT_FALSE(rep.notes.empty());
  EXPECT_NE(rep.notes[0].find("different machines: device cpu0 vs cpu1"), std::string::npos) << rep.notes[0];
  for (const auto& r : rep.rows) EXPECT_EQ(r.status, Status::insufficient) << r.key;
  // the same machine, a 50% slower step, but 3 or 4 repetitions a side: Holm over the 5 phases
  // needs 5 x 1 / C(2n, n) < 0.05, which 4 vs 4 (5 / 70) misses and 5 vs 5 (5 / 252) reaches
  for (int n : {3, 4}) {
    const CRun c = synthetic(rng, n, 0.01, 1.0), d = synthetic(rng, n, 0.01, 1.5);
    const Report few = compare_runs(c, d, Options{});
    EXPECT_EQ(few.exit_code(), 0);
    for (const auto& r : few.rows) {
      EXPECT_EQ(r.status, Status::insufficient);
      EXPECT_NE(r.reason.find("cannot reach p < 0.05 after Holm over 5 phases; at least 5 per side"), std::string::npos)
          << r.reason;
    }
    // and the report says exactly what to rerun
    EXPECT_EQ(few.rerun_hint(), "to decide, rerun both runs with --repetitions 5 (or more)");
    EXPECT_NE(format_text(few).find("rerun both runs with --repetitions 5"), std::string::npos);
  }
  // below Options::min_repetitions on one side: the rerun needs what Holm over the family needs
  const Report two = compare_runs(synthetic(rng, 2, 0.01, 1.0), synthetic(rng, 5, 0.01, 1.5), Options{});
  EXPECT_EQ(two.rerun_hint(), "to decide, rerun both runs with --repetitions 5 (or more)");
  Options quiet;  // a stated run noise of 1%: the statuses, not the noise, are under test here
  quiet.run_noise = 0.01;
  const Report five = compare_runs(synthetic(rng, 5, 0.01, 1.0), synthetic(rng, 5, 0.01, 1.5), quiet);
  EXPECT_EQ(five.rows[3].status, Status::regression) << five.rows[3].reason;
  EXPECT_EQ(five.rerun_hint().find("--repetitions"), std::string::npos) << five.rerun_hint();
  CRun e = synthetic(rng, 10, 0.01, 1.0);
  e.context["precision"] = "bf16";
  EXPECT_EQ(compare_runs(a, e, Options{}).rows[0].reason, "different configurations");
}

TEST(CompareStats, PValuesAreCalibratedAndHolmHoldsTheFamilyWiseRate) {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> n(10, 0.1);
  auto sample = [&](int k) {
    std::vector<double> v(static_cast<std::size_t>(k));
    for (auto& x : v) x = n(rng);
    return v;
  };
  // under the null the one-sided p-value is uniform: P(p < 0.05) ~ 0.05 (the exact test at 6 a
  // side is discrete, its level a little under 0.05)
  for (int k : {6, 10, 20}) {
    int below = 0;
    for (int t = 0; t < 4000; ++t) below += mann_whitney_u(sample(k), sample(k), Alternative::greater).p < 0.05;
    EXPECT_GT(below, 4000 * 0.035) << k;
    EXPECT_LT(below, 4000 * 0.065) << k;
  }
  // five null benchmarks: some raw p below 0.05 in ~23% of trials; after Holm in at most ~5%
  int raw = 0, adjusted = 0;
  for (int t = 0; t < 2000; ++t) {
    std::vector<double> p;
    for (int b = 0; b < 5; ++b) p.push_back(mann_whitney_u(sample(10), sample(10), Alternative::greater).p);
    raw += *std::min_element(p.begin(), p.end()) < 0.05;
    const auto a = holm(p);
    adjusted += *std::min_element(a.begin(), a.end()) < 0.05;
  }
  EXPECT_GT(raw, 2000 * 0.15);
  EXPECT_LT(adjusted, 2000 * 0.065);
}

TEST(CompareGate, ThrottledRepetitionsMakeARegressionUnstable) {
  std::mt19937_64 rng(3);
  const CRun a = synthetic(rng, 10, 0.01, 1.0);
  CRun b = synthetic(rng, 10, 0.01, 1.2);
  b.benchmarks[kPrefix + "/step"].throttled = 2;
  Options quiet;
  quiet.run_noise = 0.01;
  const Report rep = compare_runs(a, b, quiet);
  EXPECT_EQ(rep.exit_code(), 0);
  const auto& step = rep.rows[3];
  ASSERT_EQ(step.key, kPrefix + "/step");
  EXPECT_EQ(step.status, Status::unstable);
  EXPECT_NE(step.reason.find("throttled in 0 base and 2 head"), std::string::npos) << step.reason;
  // both sides held at the same cap in every repetition compare fairly: a regression
  CRun a2 = a;
  a2.benchmarks[kPrefix + "/step"].throttled = 10;
  b.benchmarks[kPrefix + "/step"].throttled = 10;
  EXPECT_EQ(compare_runs(a2, b, quiet).rows[3].status, Status::regression);
}

TEST(CompareGate, AFasterStepIsAnImprovementAndTheThresholdHolds) {
  std::mt19937_64 rng(5);
  const CRun a = synthetic(rng, 10, 0.01, 1.0), b = synthetic(rng, 10, 0.01, 0.9);
  Options o;
  o.run_noise = 0.01;
  EXPECT_EQ(compare_runs(a, b, o).rows[3].status, Status::improvement);
  // a real 5% slowdown under a 10% threshold: beyond the noise, but no regression; and since the
  // runs could have shown 10% (their MDC is 3.3%), no change rather than unknown
  const CRun c = synthetic(rng, 10, 0.01, 1.05);
  o.threshold = 0.10;
  const Report rep = compare_runs(a, c, o);
  EXPECT_EQ(rep.rows[3].status, Status::no_change);
  EXPECT_NE(rep.rows[3].reason.find("two lone runs show changes beyond 3.3%"), std::string::npos) << rep.rows[3].reason;
}

TEST(CompareGate, NamesTheLayerAndDirectionThatMoved) {
  std::mt19937_64 rng(11);
  CRun a = synthetic(rng, 10, 0.01, 1.0), b = synthetic(rng, 10, 0.01, 1.3);  // the step: +3 ms
  std::normal_distribution<double> n(0, 1);
  struct L {
    std::string shape, dir;
    double ms, layers, head_factor;
  };
  const std::vector<L> layers = {{"conv:16x3x64x64>16:k3x3:s2x2:p0x0", "fwd", 0.2, 1, 1.0},
                                 {"conv:16x3x64x64>16:k3x3:s2x2:p0x0", "bwd_filter", 0.3, 1, 1.0},
                                 {"conv:16x24x15x15>16:k1x1:s1x1:p0x0", "fwd", 0.1, 2, 1.0},
                                 {"conv:16x24x15x15>16:k1x1:s1x1:p0x0", "bwd_data", 0.1, 2, 1.0},
                                 {"conv:16x12x15x15>16:k5x5:s1x1:p2x2", "bwd_filter", 0.5, 2, 4.0},  // +3 ms
                                 {"conv:16x12x15x15>16:k5x5:s1x1:p2x2", "fwd", 0.4, 2, 1.0}};
  for (auto* r : {&a, &b})
    for (const auto& l : layers) {
      const std::string key = kPrefix + "/" + l.shape + "/" + l.dir;
      r->order.push_back(key);
      Series& s = r->benchmarks[key];
      s.layers = l.layers;
      s.label = l.shape.find("k5x5") != std::string::npos ? "block.branch5x5_2, block2.branch5x5_2" : "";
      for (int i = 0; i < 10; ++i) s.ms.push_back(l.ms * (r == &b ? l.head_factor : 1.0) * (1 + 0.01 * n(rng)));
    }
  Options quiet;
  quiet.run_noise = 0.01;
  const Report rep = compare_runs(a, b, quiet);
  EXPECT_EQ(rep.exit_code(), 1);
  const Row* step = nullptr;
  for (const auto& r : rep.rows)
    if (r.key == kPrefix + "/step") step = &r;
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->status, Status::regression);
  ASSERT_EQ(step->layers.size(), 1u);
  EXPECT_EQ(step->layers[0].key, "conv:16x12x15x15>16:k5x5:s1x1:p2x2");
  EXPECT_EQ(step->layers[0].direction, "backward filter");
  EXPECT_EQ(step->layers[0].label, "block.branch5x5_2, block2.branch5x5_2");
  EXPECT_NEAR(step->layers[0].delta_ms, 3.0, 0.2);  // 1.5 ms more per call x 2 layers
  EXPECT_NEAR(step->layers[0].share, 1.0, 0.1);
  // forward's directions do not include backward filter: nothing named there (and it did not move)
  const std::string md = format_markdown(rep);
  EXPECT_NE(md.find("backward filter [block.branch5x5_2, block2.branch5x5_2]"), std::string::npos) << md;
  EXPECT_NE(md.find("**regression**"), std::string::npos);
  // the step and the per-layer benchmark itself
  EXPECT_NE(format_text(rep).find("REGRESSION: 1 regression"), std::string::npos) << format_text(rep);
  EXPECT_NE(format_text(rep).find("; 1 per-layer regression"), std::string::npos) << format_text(rep);
  EXPECT_NE(format_json(rep).find("\"direction\": \"backward filter\""), std::string::npos);
}

// Series of run medians (logs): run-level noise `sd`, a step of `step` from run `at` on.
std::vector<double> series(std::mt19937_64& rng, std::size_t n, double sd, double step, std::size_t at,
                           std::size_t until = SIZE_MAX) {
  std::normal_distribution<double> z(0, sd);
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = z(rng) + (i >= at && i < until ? std::log1p(step) : 0.0);
  return x;
}

TEST(CompareGate, ChangePointsInAHistoryAreFoundAndDated) {
  // 1,000 flat series of 30 runs (run noise 4%): at most 1% get a change point
  std::mt19937_64 rng(30);
  int false_cps = 0;
  for (int t = 0; t < 1000; ++t) false_cps += !change_points(series(rng, 30, 0.04, 0, 30), 0.005).empty();
  std::cout << false_cps << " of 1000 flat 30-run series with a change point\n";
  EXPECT_LE(false_cps, 10) << false_cps << " of 1000 flat series";
  // a 5% step 6 runs before the end of a 30-run series, on a runner whose runs move by 1.5%: found
  // in at least 90% of series within the step's 6 runs, at the right run in at least 80%. (At 2% the
  // single-split detector found 86% and 62%; at 4% a 5% step is 1.2 sd, which 6 runs cannot tell
  // from chance at this false-alarm rate, by any test.)
  int found = 0, exact = 0;
  for (int t = 0; t < 1000; ++t) {
    const auto cps = change_points(series(rng, 30, 0.015, 0.05, 24), 0.005);
    bool near = false, right = false;
    for (const auto& c : cps) {
      near = near || (c.index >= 21 && c.index <= 27);
      right = right || c.index == 24;
    }
    found += near;
    exact += right;
  }
  std::cout << "a 5% step 6 runs from the end: found within 3 runs of it in " << found << " of 1000, at its run in "
            << exact << "\n";
  EXPECT_GE(found, 900) << found << " of 1000";
  EXPECT_GE(exact, 800) << exact << " of 1000";
  // on the issue's noisier runner (runs move by 4%), what 6 runs can date: a 15% step
  int found4 = 0, exact4 = 0;
  for (int t = 0; t < 1000; ++t) {
    const auto cps = change_points(series(rng, 30, 0.04, 0.15, 24), 0.005);
    bool near = false, right = false;
    for (const auto& c : cps) {
      near = near || (c.index >= 21 && c.index <= 27);
      right = right || c.index == 24;
    }
    found4 += near;
    exact4 += right;
  }
  std::cout << "run noise 4%, a 15% step 6 runs from the end: found within 3 runs of it in " << found4
            << " of 1000, at its run in " << exact4 << "\n";
  EXPECT_GE(found4, 900) << found4 << " of 1000";
  EXPECT_GE(exact4, 800) << exact4 << " of 1000";
  // a regression and its fix: runs 10 to 17 of 30 slower by 5% (run noise 1.5%); both ends dated
  // within 2 runs in at least 90% of series. A single split sees the stretch diluted by the 12 runs
  // after it: binary segmentation by single splits alone found both ends in 5 of 1000 (this: 969)
  int both = 0;
  for (int t = 0; t < 500; ++t) {
    const auto cps = change_points(series(rng, 30, 0.015, 0.05, 10, 18), 0.005);
    bool up = false, down = false;
    for (const auto& c : cps) {
      up = up || (c.index >= 8 && c.index <= 12 && c.change > 0);
      down = down || (c.index >= 16 && c.index <= 20 && c.change < 0);
    }
    both += up && down;
  }
  std::cout << "5% slower for runs 10 to 17 of 30: both ends found within 2 runs in " << both << " of 500\n";
  EXPECT_GE(both, 450) << both << " of 500";
}

TEST(CompareFiles, AHistoryGivesTheNoiseAndDatesTheChange) {
  test::TempDir d("compare");
  std::mt19937_64 rng(12);
  std::normal_distribution<double> z(0, 1);
  // 12 runs whose medians move by 1% between runs; the last 4 are 10% slower in the step
  std::string lines;
  for (int i = 0; i < 12; ++i) {
    CRun r = synthetic(rng, 5, 0.005, i >= 8 ? 1.10 : 1.0, "cpu0", std::exp(0.01 * z(rng)));
    r.context["revision"] = "rev" + std::to_string(i);
    lines += history_record(r, fmt::format("2026-11-{:02d}T00:00:00Z", i + 1)) + "\n";
  }
  const std::string f = d.write("h.jsonl", lines);
  CRun head = synthetic(rng, 5, 0.005, 1.10, "cpu0", std::exp(0.01 * z(rng)));
  head.context["revision"] = "head";
  const Report rep = compare_runs(load_history(f, head, 5), head, Options{});
  ASSERT_FALSE(rep.changes.empty());
  const auto& c = rep.changes.back();
  EXPECT_EQ(c.key, kPrefix + "/step");
  EXPECT_EQ(c.run, 8u);  // the first slow run: rev8
  EXPECT_EQ(c.revision, "rev8");
  EXPECT_EQ(c.time, "2026-11-09T00:00:00Z");
  EXPECT_NEAR(c.change, 0.10, 0.03);
  EXPECT_EQ(rep.exit_code(), 1);  // HEAD sits after a slowdown beyond the threshold
  const Row& step = rep.rows[3];
  EXPECT_EQ(step.status, Status::regression);
  EXPECT_NE(step.reason.find("slowed by"), std::string::npos) << step.reason;
  EXPECT_NE(format_text(rep).find("change point: step"), std::string::npos) << format_text(rep);
  // the other phases: no change point; their noise measured from the history, the level unchanged
  const Row& fwd = rep.rows[0];
  EXPECT_EQ(fwd.evidence, "history");
  EXPECT_NE(fwd.noise_source.find("the spread of 12 earlier runs"), std::string::npos) << fwd.noise_source;
  EXPECT_NE(fwd.status, Status::regression);
  // a flat history and a HEAD 8% slower than every run in it: outside the prediction interval
  std::string flat;
  for (int i = 0; i < 10; ++i) {
    CRun r = synthetic(rng, 5, 0.005, 1.0, "cpu0", std::exp(0.01 * z(rng)));
    r.context["revision"] = "f" + std::to_string(i);
    flat += history_record(r, "t") + "\n";
  }
  const std::string g = d.write("flat.jsonl", flat);
  CRun slow = synthetic(rng, 5, 0.005, 1.08);
  slow.context["revision"] = "slow";
  const Report pi = compare_runs(load_history(g, slow, 5), slow, Options{});
  EXPECT_EQ(pi.rows[3].status, Status::regression) << pi.rows[3].reason;
  EXPECT_TRUE(pi.changes.empty());
  CRun same = synthetic(rng, 5, 0.005, 1.0);
  same.context["revision"] = "same";
  EXPECT_EQ(compare_runs(load_history(g, same, 5), same, Options{}).exit_code(), 0);
  // a fix after a slowdown: 10 runs, 10 runs 20% slower, HEAD back at the first level; the change
  // point stands, but HEAD is not after it in level: no regression
  std::string fixed;
  for (int i = 0; i < 20; ++i) {
    CRun r = synthetic(rng, 5, 0.005, i >= 10 ? 1.2 : 1.0, "cpu0", std::exp(0.005 * z(rng)));
    r.context["revision"] = fmt::format("x{}", i);  // not "x" + to_string: GCC 12's -Wrestrict at -O3
    fixed += history_record(r, "t") + "\n";
  }
  const std::string fx = d.write("fixed.jsonl", fixed);
  CRun back = synthetic(rng, 5, 0.005, 1.0);
  back.context["revision"] = "fix";
  const Report fr = compare_runs(load_history(fx, back, 5), back, Options{});
  EXPECT_FALSE(fr.changes.empty());
  EXPECT_NE(fr.rows[3].status, Status::regression) << fr.rows[3].reason;
  // after the fix, 10 more runs at the first level: two change points; the noise comes from the runs
  // since the last one alone, so a HEAD 8% over them is a regression (the 30 runs together spread by
  // 9%, the 20 since the first change by 10%: either would call it unknown)
  for (int i = 20; i < 30; ++i) {
    CRun r = synthetic(rng, 5, 0.005, 1.0, "cpu0", std::exp(0.005 * z(rng)));
    r.context["revision"] = fmt::format("x{}", i);
    fixed += history_record(r, "t") + "\n";
  }
  const std::string fx2 = d.write("fixed_twice.jsonl", fixed);
  CRun later = synthetic(rng, 5, 0.005, 1.08);
  later.context["revision"] = "later";
  const Report two = compare_runs(load_history(fx2, later, 5), later, Options{});
  std::size_t step_changes = 0;
  for (const auto& c : two.changes) step_changes += c.key == kPrefix + "/step";
  EXPECT_EQ(step_changes, 2u) << format_text(two);
  const Row& s2 = two.rows[3];
  EXPECT_EQ(s2.status, Status::regression) << s2.reason;
  EXPECT_NE(s2.noise_source.find("the spread of 10 earlier runs since the last change"), std::string::npos)
      << s2.noise_source;
}

// The base of a run against its history is each phase's runs since the last change point of its
// series (the last --last of them at most), and the report names that window: 12 runs, the step 10%
// slower from run 9 (rev8) on; the other phases flat.
TEST(CompareFiles, TheBaseWindowIsTheRunsSinceTheLastChangePoint) {
  test::TempDir d("compare");
  std::mt19937_64 rng(14);
  std::normal_distribution<double> z(0, 1);
  std::string lines;
  for (int i = 0; i < 12; ++i) {
    CRun r = synthetic(rng, 5, 0.005, i >= 8 ? 1.10 : 1.0, "cpu0", std::exp(0.005 * z(rng)));
    r.context["revision"] = "rev" + std::to_string(i);
    lines += history_record(r, "t") + "\n";
  }
  const std::string f = d.write("h.jsonl", lines);
  CRun head = synthetic(rng, 5, 0.005, 1.10, "cpu0");
  head.context["revision"] = "head";
  const CRun base = load_history(f, head, 5);
  CRun pooled = base;
  const auto windows = pool_since_change(pooled);
  EXPECT_EQ(windows.at(kPrefix + "/step"), "runs 9-12 of 12, since the change point at run 9 (rev8)");
  EXPECT_EQ(pooled.benchmarks.at(kPrefix + "/step").ms.size(), 4u * 5);  // not run 8, before the change
  EXPECT_EQ(windows.at(kPrefix + "/forward"), "runs 8-12 of 12, the last 5");
  const Report rep = compare_runs(base, head, Options{});
  const std::string text = format_text(rep);
  EXPECT_NE(rep.base_source.find("runs 9-12 of 12, since the change point at run 9 (rev8) for step"), std::string::npos)
      << rep.base_source;
  EXPECT_NE(rep.base_source.find("runs 8-12 of 12, the last 5 for forward"), std::string::npos) << rep.base_source;
  // HEAD at the level since the change: the step's within-run test sees no difference from its base
  const Row& step = rep.rows[3];
  EXPECT_LT(std::abs(step.change), 0.03) << text;
}

TEST(CompareFiles, AbRoundsReadPairedAndBadRoundsAreRefused) {
  test::TempDir d("compare");
  const std::string ok = d.write("ab.json", R"({"context": {"ab_rounds": 2, "ab_side": "base"},
    "benchmarks": [
      {"name": "m/step", "run_type": "iteration", "real_time": 2.0, "time_unit": "ms", "ab_round": 1},
      {"name": "m/step", "run_type": "iteration", "real_time": 2.2, "time_unit": "ms", "ab_round": 2}]})");
  const CRun r = load_run(ok);
  EXPECT_EQ(r.rounds, 2);
  EXPECT_EQ(r.benchmarks.at("m/step").round, (std::vector<int>{1, 2}));
  EXPECT_THROW(load_run(d.write("r3.json", R"({"context": {"ab_rounds": 2}, "benchmarks": [
      {"name": "m/step", "run_type": "iteration", "real_time": 2.0, "time_unit": "ms", "ab_round": 3}]})")),
               CompareError);
  EXPECT_THROW(load_run(d.write("none.json", R"({"context": {"ab_rounds": 2}, "benchmarks": [
      {"name": "m/step", "run_type": "iteration", "real_time": 2.0, "time_unit": "ms"}]})")),
               CompareError);
}

TEST(CompareFiles, ReadsIterationsAcrossUnitsAndRefusesWhatIsNotARun) {
  test::TempDir d("compare");
  const std::string f = d.write("run.json", R"({"context": {"device": "x", "host_name": "h"},
    "benchmarks": [
      {"name": "m/step/repeats:2/manual_time", "run_name": "m/step/repeats:2/manual_time", "run_type": "iteration",
       "repetition_index": 0, "real_time": 2.5, "time_unit": "ms", "throttled": 1},
      {"name": "m/step/repeats:2/manual_time", "run_name": "m/step/repeats:2/manual_time", "run_type": "iteration",
       "repetition_index": 1, "real_time": 3000.0, "time_unit": "us"},
      {"name": "m/step/repeats:2/manual_time_median", "run_name": "m/step/repeats:2/manual_time",
       "run_type": "aggregate", "real_time": 99.0, "time_unit": "ms"},
      {"name": "m/conv:1x1/fwd/repeats:2/manual_time", "run_type": "iteration", "real_time": 1e6, "time_unit": "ns",
       "layers": 3, "label": "a, b"}]})");
  const CRun r = load_run(f);
  ASSERT_EQ(r.order, (std::vector<std::string>{"m/step", "m/conv:1x1/fwd"}));
  EXPECT_EQ(r.benchmarks.at("m/step").ms, (std::vector<double>{2.5, 3.0}));
  EXPECT_EQ(r.benchmarks.at("m/step").throttled, 1);
  EXPECT_DOUBLE_EQ(r.benchmarks.at("m/conv:1x1/fwd").ms[0], 1.0);
  EXPECT_DOUBLE_EQ(r.benchmarks.at("m/conv:1x1/fwd").layers, 3);
  EXPECT_EQ(r.benchmarks.at("m/conv:1x1/fwd").label, "a, b");
  EXPECT_EQ(r.context.at("device"), "x");
  // Google Benchmark's NaN and Infinity (a cv over all-zero counters) read as null; not inside strings
  const CRun n = load_run(d.write("nan.json", R"({"context": {"note": "NaN stays", "host_name": "h"},
    "benchmarks": [
      {"name": "m/step", "run_type": "iteration", "real_time": 2.0, "time_unit": "ms", "throttled": 0},
      {"name": "m/step_cv", "run_name": "m/step", "run_type": "aggregate", "real_time": 0.1, "throttled": NaN,
       "gap_ms": -Infinity, "x": Infinity}]})"));
  EXPECT_EQ(n.benchmarks.at("m/step").ms, (std::vector<double>{2.0}));
  EXPECT_EQ(n.context.at("note"), "NaN stays");
  EXPECT_THROW(load_run((d.p / "missing.json").string()), CompareError);
  EXPECT_THROW(load_run(d.write("bad.json", "{not json")), CompareError);
  EXPECT_THROW(load_run(d.write("other.json", R"({"results": []})")), CompareError);
  // fields of the wrong type or impossible times: a usage error, not an exception that exits 1
  EXPECT_THROW(load_run(d.write("t1.json", R"({"benchmarks": [{"name": "a/step", "real_time": "2.5"}]})")),
               CompareError);
  EXPECT_THROW(load_run(d.write("t2.json", R"({"benchmarks": [{"name": "a/step", "real_time": 0}]})")), CompareError);
  EXPECT_THROW(load_run(d.write("t3.json", R"({"benchmarks": [{"name": 5, "real_time": 1}]})")), CompareError);
  CRun other = r;
  other.benchmarks.clear();
  other.benchmarks["n/step"].ms = {1.0};
  other.order = {"n/step"};
  EXPECT_THROW(compare_runs(r, other, Options{}), CompareError);  // nothing in common: a usage error
}

TEST(CompareFiles, HistoryPoolsTheLastMatchingRunsOfOtherRevisions) {
  test::TempDir d("compare");
  std::mt19937_64 rng(9);
  std::string lines;
  for (int i = 0; i < 4; ++i) {
    CRun r = synthetic(rng, 5, 0.01, 1.0, i == 1 ? "elsewhere" : "cpu0");
    r.context["revision"] = "rev" + std::to_string(i);
    lines += history_record(r, "2026-11-22T00:00:0" + std::to_string(i) + "Z") + "\n";
  }
  const std::string f = d.write("h.jsonl", lines);
  CRun head = synthetic(rng, 5, 0.01, 1.0);
  head.context["revision"] = "rev3";  // the head's own record is not its baseline
  CRun base = load_history(f, head, 5);
  EXPECT_NE(base.source.find("2 earlier runs"), std::string::npos) << base.source;
  EXPECT_EQ(base.benchmarks.at(kPrefix + "/step").run_ms.size(), 2u);  // rev0 and rev2
  const auto windows = pool_since_change(base);
  EXPECT_EQ(base.benchmarks.at(kPrefix + "/step").ms.size(), 10u);  // 5 + 5
  EXPECT_EQ(windows.at(kPrefix + "/step"), "runs 1-2 of 2");
  CRun last = load_history(f, head, 1);
  EXPECT_EQ(pool_since_change(last).at(kPrefix + "/step"), "run 2 of 2, the last 1");
  EXPECT_EQ(last.benchmarks.at(kPrefix + "/step").ms.size(), 5u);
  head.context["device"] = "new";
  const CRun none = load_history(f, head, 5);
  EXPECT_TRUE(none.benchmarks.empty());
  const Report rep = compare_runs(none, head, Options{});
  EXPECT_EQ(rep.exit_code(), 0);
  EXPECT_EQ(rep.rows[0].status, Status::insufficient);
  EXPECT_THROW(load_history(d.write("bad.jsonl", "{}\n{oops\n"), head, 5), CompareError);
  EXPECT_THROW(load_history(d.write("arr.jsonl", "[]\n"), head, 5), CompareError);
  EXPECT_THROW(load_history(d.write("rev.jsonl", R"({"revision": 5})"), head, 5), CompareError);
  // built outside git: every revision is "unknown", which excludes nothing
  head.context["device"] = "cpu0";
  CRun u = synthetic(rng, 5, 0.01, 1.0);
  u.context["revision"] = "unknown";
  head.context["revision"] = "unknown";
  EXPECT_EQ(load_history(d.write("u.jsonl", history_record(u, "t") + "\n"), head, 5).benchmarks.size(), 5u);
}

}  // namespace
}  // namespace stepbench::compare
