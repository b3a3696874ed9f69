// The regression gate: the U test against scipy, Holm, the status rules on synthetic repetitions
// (false alarms and power), fingerprints, throttling, the layers that moved, files and history.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "compare/compare.hpp"
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
  EXPECT_DOUBLE_EQ(holm({0.5, 0.6})[1], 1.0);  // capped at 1
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

const std::string kPrefix = "tiny/fp32/nchw/gpus:1/batch:16";

CRun synthetic(std::mt19937_64& rng, int reps, double noise, double step_factor, const std::string& device = "cpu0") {
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
      r.benchmarks[key].ms.push_back(ms * (ph == "step" ? step_factor : 1.0) * (1 + noise * n(rng)));
  }
  return r;
}

TEST(CompareGate, SameDistributionRaisesNoAlarmIn95PercentOf200Trials) {
  std::mt19937_64 rng(2026);
  int alarms = 0;
  for (int t = 0; t < 200; ++t) {
    const CRun a = synthetic(rng, 10, 0.01, 1.0), b = synthetic(rng, 10, 0.01, 1.0);
    alarms += compare_runs(a, b, Options{}).exit_code();
  }
  EXPECT_LE(alarms, 10) << alarms << " false alarms in 200 trials";
}

TEST(CompareGate, AFivePercentSlowerStepIsARegressionIn90PercentOfTrials) {
  std::mt19937_64 rng(7);
  int found = 0, others = 0;
  for (int t = 0; t < 200; ++t) {
    const CRun a = synthetic(rng, 10, 0.01, 1.0), b = synthetic(rng, 10, 0.01, 1.05);
    const Report rep = compare_runs(a, b, Options{});
    for (const auto& r : rep.rows) {
      if (r.key == kPrefix + "/step")
        found += r.status == Status::regression;
      else
        others += r.status == Status::regression;
    }
  }
  EXPECT_GE(found, 180) << found << " of 200";
  EXPECT_LE(others, 10);  // the phases that did not change stay quiet
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
  const Report five = compare_runs(synthetic(rng, 5, 0.01, 1.0), synthetic(rng, 5, 0.01, 1.5), Options{});
  EXPECT_EQ(five.rows[3].status, Status::regression) << five.rows[3].reason;
  EXPECT_EQ(five.rerun_hint(), "");
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
  const Report rep = compare_runs(a, b, Options{});
  EXPECT_EQ(rep.exit_code(), 0);
  const auto& step = rep.rows[3];
  ASSERT_EQ(step.key, kPrefix + "/step");
  EXPECT_EQ(step.status, Status::unstable);
  EXPECT_NE(step.reason.find("throttled in 0 base and 2 head"), std::string::npos) << step.reason;
  // both sides held at the same cap in every repetition compare fairly: a regression
  CRun a2 = a;
  a2.benchmarks[kPrefix + "/step"].throttled = 10;
  b.benchmarks[kPrefix + "/step"].throttled = 10;
  EXPECT_EQ(compare_runs(a2, b, Options{}).rows[3].status, Status::regression);
}

TEST(CompareGate, AFasterStepIsAnImprovementAndTheThresholdHolds) {
  std::mt19937_64 rng(5);
  const CRun a = synthetic(rng, 10, 0.01, 1.0), b = synthetic(rng, 10, 0.01, 0.9);
  EXPECT_EQ(compare_runs(a, b, Options{}).rows[3].status, Status::improvement);
  // a real 5% slowdown under a 10% threshold: significant, but no regression
  const CRun c = synthetic(rng, 10, 0.01, 1.05);
  Options o;
  o.threshold = 0.10;
  const Report rep = compare_runs(a, c, o);
  EXPECT_EQ(rep.rows[3].status, Status::no_change);
  EXPECT_NE(rep.rows[3].reason.find("within 10.0%"), std::string::npos) << rep.rows[3].reason;
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
  const Report rep = compare_runs(a, b, Options{});
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
  EXPECT_NE(format_text(rep).find("REGRESSION: 2 regressions"), std::string::npos) << format_text(rep);
  EXPECT_NE(format_json(rep).find("\"direction\": \"backward filter\""), std::string::npos);
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
  const CRun base = load_history(f, head, 5);
  EXPECT_EQ(base.benchmarks.at(kPrefix + "/step").ms.size(), 10u);  // rev0 and rev2: 5 + 5
  EXPECT_NE(base.source.find("2 runs: rev0, rev2"), std::string::npos) << base.source;
  EXPECT_EQ(load_history(f, head, 1).benchmarks.at(kPrefix + "/step").ms.size(), 5u);
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
