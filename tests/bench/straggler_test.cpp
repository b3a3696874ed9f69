// The straggler report on synthetic timelines whose answer is known (a tower slowed by a known
// delay, one slowed in some repetitions only, quiet towers, towers one after another, a hold after
// some buckets went that the chain of syncs partly hides, the syncs derived from the timelines with
// start offsets, a slow tower in the middle of a process, the noise and threshold as fractions),
// the two-level fabric, nccl-tests' fit and the straggler tax. Planted faults each of them catches
// (2026-11-28): a cost of max(0, slow compute - reference compute) fails the hold and derived-sync
// tests; a replay that shifts only the slow tower of a process fails the middle-tower test; the
// noise as a spread in ms fails the fractions test. (2026-11-29) A wait without the compute or the
// start taken off, `individual` inverted, and the fastest or the upper middle of the others as the
// reference each fail the first test or the reference test.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>

#include "bench/fabric.hpp"
#include "bench/stats.hpp"
#include "bench/straggler.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

// `towers` towers stepping in parallel: forward 4 ms, backward 6 ms (x noise), 3 buckets ready at
// 30%, 60% and 100% of backward, each synced in sync_ms from when every tower has it. slow(r, s, t):
// the extra ms tower t spends at the start of its backward in repetition r, step s.
StragglerInput parallel_towers(int towers, double noise, double sync_ms,
                               const std::function<double(int, int, int)>& slow, int reps = 3, int steps = 10,
                               std::uint64_t seed = 5) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> jitter(1.0, noise);
  StragglerInput in;
  for (int t = 0; t < towers; ++t) in.towers.push_back({t, t, t, "node1", fmt::format("0000:{:02x}:00.0", t), "", ""});
  in.sync_ms = {sync_ms, sync_ms, sync_ms};
  for (int r = 0; r < reps; ++r) {
    in.steps.emplace_back();
    in.step_ms.emplace_back();
    for (int s = 0; s < steps; ++s) {
      std::vector<TowerStep> step;
      std::vector<std::vector<double>> ready;
      for (int t = 0; t < towers; ++t) {
        TowerStep ts;
        ts.forward_ms = 4 * jitter(rng);
        const double delay = slow(r, s, t), b = 6 * jitter(rng);
        ts.backward_ms = delay + b;
        for (double f : {0.3, 0.6, 1.0}) ts.ready_ms.push_back(ts.forward_ms + delay + f * b);
        step.push_back(ts);
      }
      double end = 0;  // the syncs one after another from when every tower has the bucket
      for (std::size_t k = 0; k < 3; ++k) {
        double start = 0;
        for (const auto& ts : step) start = std::max(start, ts.ready_ms[k]);
        end = std::max(end, start) + sync_ms;
      }
      for (auto& ts : step) ts.released_ms = end;
      in.steps.back().push_back(step);
      in.step_ms.back().push_back(end + 1.0);  // the update
    }
  }
  return in;
}

TEST(Straggler, NamesTheSlowTowerAndCostsItsDelay) {
  const auto in = parallel_towers(4, 0.01, 0.2, [](int, int, int t) { return t == 2 ? 5.0 : 0.0; });
  const auto r = analyze_stragglers(in);
  ASSERT_TRUE(r.valid);
  EXPECT_EQ(r.slowest, 2);
  EXPECT_EQ(r.verdict, "chronic");
  EXPECT_EQ(r.towers[2].slowest_in, 3);
  EXPECT_NEAR(r.cost_ms, 5.0, 0.5);
  EXPECT_NEAR(r.towers[2].relative, 10.0 / 15.0, 0.03);
  // the others wait for it: released at 15.2 (its 15 ms, then the last sync), after their 10 ms
  EXPECT_NEAR(r.towers[0].wait_ms, 5.2, 0.3);
  EXPECT_NEAR(r.towers[2].wait_ms, 0.2, 0.3);
  // each tower's own spread: its best compute over its median
  for (std::size_t t = 0; t < 4; ++t) {
    std::vector<double> c;
    for (const auto& rep : in.steps)
      for (const auto& step : rep) c.push_back(step[t].compute());
    EXPECT_NEAR(r.towers[t].individual, *std::min_element(c.begin(), c.end()) / median(c), 1e-12) << "tower " << t;
    EXPECT_LT(r.towers[t].individual, 1.0);
  }
  const auto lines = straggler_lines(in, r, 3);
  ASSERT_GE(lines.size(), 5u);
  EXPECT_NE(lines[1].find("slowest: tower 2 (rank 2, node1, GPU 2 0000:02:00.0)"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("chronic"), std::string::npos);
  for (const auto& l : lines) EXPECT_LE(l.size(), 100u + 60u) << l;  // a few prose lines wrap; the table fits
  const auto j = straggler_json(in, r);
  EXPECT_EQ(j["slowest"], 2);
  EXPECT_EQ(j["verdict"], "chronic");
}

TEST(Straggler, OneSlowRepetitionIsOccasional) {
  const auto in = parallel_towers(3, 0.01, 0.2, [](int rep, int, int t) { return rep == 1 && t == 1 ? 4.0 : 0.0; });
  const auto r = analyze_stragglers(in);
  EXPECT_EQ(r.verdict, "occasional");
  EXPECT_EQ(r.flagged, 1);
}

TEST(Straggler, QuietTowersHaveNoChronicStraggler) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const auto in = parallel_towers(
        8, 0.03, 0.2, [](int, int, int) { return 0.0; }, 3, 10, seed);
    const auto r = analyze_stragglers(in);
    EXPECT_NE(r.verdict, "chronic") << "seed " << seed;
    EXPECT_GE(r.threshold, 0.05);
    EXPECT_LT(r.cost_ms, 1.0) << "seed " << seed;
  }
}

TEST(Straggler, ASyncThatHidesPartOfTheDelayCountsTheSlack) {
  // syncs of 8 ms each: the chain of syncs, not the compute, ends the step; 2 ms more compute on one
  // tower delays only the first bucket's sync, and the chain absorbs most of it
  const auto in = parallel_towers(2, 0.0, 8.0, [](int, int, int t) { return t == 1 ? 2.0 : 0.0; });
  const auto r = analyze_stragglers(in);
  EXPECT_EQ(r.slowest, 1);
  EXPECT_NEAR(r.cost_ms, 2.0, 1e-9);  // bucket 0 starts 2 ms later and the chain after it follows
  const auto tight = parallel_towers(2, 0.0, 0.0, [](int, int, int t) { return t == 1 ? 2.0 : 0.0; });
  EXPECT_NEAR(analyze_stragglers(tight).cost_ms, 2.0, 1e-9);
}

TEST(Straggler, TowersOneAfterAnotherAddTheirExtraCompute) {
  // the cpu backend's towers in one process: tower 1 runs after tower 0; its 3 ms more are the cost
  StragglerInput in;
  in.sequential = true;
  in.towers_per_process = 2;
  in.towers = {{0, 0, -1, "h", "", "", ""}, {1, 0, -1, "h", "", "", ""}};
  in.sync_ms = {0.1};
  in.steps.assign(2, {});
  in.step_ms.assign(2, {});
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < 5; ++s) {
      TowerStep a{0, 4, 6, {}, {}, 0}, b{4, 4, 9, {}, {}, 0};  // f0 f1 b0 b1, tower 1's backward 3 ms longer
      a.ready_ms = {4 + 4 + 6};
      b.ready_ms = {4 + 4 + 6 + 9};
      a.released_ms = b.released_ms = 23.1;
      in.steps[r].push_back({a, b});
      in.step_ms[r].push_back(23.1);
    }
  const auto r = analyze_stragglers(in);
  EXPECT_EQ(r.slowest, 1);
  EXPECT_NEAR(r.cost_ms, 3.0, 1e-9);
}

// One step of towers in parallel with its buckets synced one after another, each taking sync_ms[k]
// from when every tower has it ready and the previous sync is done. Tower t starts at begin[t]
// (ms after its process's step start), runs forward 4 ms and backward 6 ms plus hold[t], the hold
// after hold_at of its backward; bucket k is ready at frac[k] of the backward's own work.
std::vector<TowerStep> synced_step(const std::vector<double>& begin, const std::vector<double>& hold, double hold_at,
                                   const std::vector<double>& frac, const std::vector<double>& sync_ms) {
  std::vector<TowerStep> step;
  for (std::size_t t = 0; t < begin.size(); ++t) {
    TowerStep ts;
    ts.begin_ms = begin[t];
    ts.forward_ms = 4;
    ts.backward_ms = 6 + hold[t];
    for (double f : frac) ts.ready_ms.push_back(begin[t] + 4 + 6 * f + (f > hold_at ? hold[t] : 0.0));
    step.push_back(ts);
  }
  double end = 0;
  std::vector<double> synced;
  for (std::size_t k = 0; k < frac.size(); ++k) {
    double start = end;
    for (const auto& ts : step) start = std::max(start, ts.ready_ms[k]);
    end = start + sync_ms[k];
    synced.push_back(end);
  }
  for (auto& ts : step) {
    ts.synced_ms = synced;
    ts.released_ms = end;
  }
  return step;
}

StragglerInput one_step_input(const std::vector<TowerStep>& step, const std::vector<double>& sync_ms) {
  StragglerInput in;
  for (int t = 0; t < static_cast<int>(step.size()); ++t)
    in.towers.push_back({t, t, t, "node1", fmt::format("0000:{:02x}:00.0", t), "", ""});
  in.sync_ms = sync_ms;
  in.steps = {{step, step, step}};
  in.step_ms = {{step[0].released_ms + 1, step[0].released_ms + 1, step[0].released_ms + 1}};
  return in;
}

TEST(Straggler, AHoldAfterSomeBucketsWentShowsOnlyPartOfIt) {
  // 2 towers; buckets ready at 30%, 60% and 100% of backward, syncs of 4 ms each. Tower 1 is held
  // 5 ms at 70% of its backward, after two buckets went: bucket 2 is ready at 15 instead of 10, but
  // the chain of syncs is busy until 13.8, so the step ends 19 instead of 17.8: 1.2 ms of the 5.
  // (A hold at the start of backward, as before, delays every bucket: the whole 5 ms.)
  const std::vector<double> sync = {4, 4, 4};
  const auto step = synced_step({0, 0}, {0, 5}, 0.7, {0.3, 0.6, 1.0}, sync);
  const auto r = analyze_stragglers(one_step_input(step, sync));
  EXPECT_EQ(r.slowest, 1);
  EXPECT_NEAR(r.cost_ms, 1.2, 1e-9);  // a naive max(0, slow compute - reference compute) says 5
  // a 3 ms hold there is hidden entirely: ready at 13, the chain busy until 13.8
  EXPECT_NEAR(analyze_stragglers(one_step_input(synced_step({0, 0}, {0, 3}, 0.7, {0.3, 0.6, 1.0}, sync), sync)).cost_ms,
              0.0, 1e-9);
  // the same hold at the start of backward: every bucket later, the whole 5 ms
  EXPECT_NEAR(analyze_stragglers(one_step_input(synced_step({0, 0}, {0, 5}, 0.0, {0.3, 0.6, 1.0}, sync), sync)).cost_ms,
              5.0, 1e-9);
}

TEST(Straggler, BucketSyncTimesFromTheTimelinesWithStartOffsets) {
  // what real runs take: no sync_ms given, each bucket's collective derived from the timelines
  // (bucket_sync_ms); the towers start 0.7 and 1.9 ms after their processes' step start. Tower 2,
  // held 5 ms at 70% of its backward, has its buckets ready at 7.7, 9.5 and 16.9; the chain of syncs
  // (1.5, 4, 2.5 ms) ends bucket 1 at 13.5, so bucket 2 runs 16.9-19.4. With tower 2 at the
  // reference's backward its bucket 2 is ready at 11.9 and runs 13.5-16.0: a cost of 3.4 of the 5.
  const std::vector<double> sync = {1.5, 4, 2.5};
  const auto step = synced_step({0.0, 0.7, 1.9}, {0, 0, 5}, 0.7, {0.3, 0.6, 1.0}, sync);
  const StragglerInput in = one_step_input(step, {});
  const auto derived = bucket_sync_ms(in);
  ASSERT_EQ(derived.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k) EXPECT_NEAR(derived[k], sync[k], 1e-9) << "bucket " << k;
  const auto r = analyze_stragglers(in);
  EXPECT_EQ(r.slowest, 2);
  EXPECT_NEAR(r.cost_ms, 3.4, 1e-9);                                               // naive: 5
  EXPECT_NEAR(analyze_stragglers(one_step_input(step, sync)).cost_ms, 3.4, 1e-9);  // the syncs given: the same
  // a longer first sync (6 ms) hides more: the chain is busy until 14.7, bucket 2 ready at 16.9
  // (11.9 without the hold): 17.9 against 15.7, 2.2 of the 5
  const std::vector<double> long_first = {6, 1, 1};
  const StragglerInput pin =
      one_step_input(synced_step({0.0, 0.7, 1.9}, {0, 0, 5}, 0.7, {0.3, 0.6, 1.0}, long_first), {});
  EXPECT_NEAR(analyze_stragglers(pin).cost_ms, 2.2, 1e-9);
}

TEST(Straggler, TheReferenceIsTheOthersMiddleAndWaitsCountFromEachStart) {
  // 5 towers in parallel, one bucket at the end, no sync time: towers 0-3 start at 0 and compute
  // 10, 11, 12, 13 ms; tower 4 starts at 5 and computes 20, ending the step at 25. At the reference's
  // compute (the others' lower middle: 11 ms) from its own start it would end at 16: a cost of 9
  // (the fastest as reference says 10, the upper middle 8).
  const auto step = synced_step({0, 0, 0, 0, 5}, {0, 1, 2, 3, 10}, 0.0, {1.0}, {0.0});
  const auto r = analyze_stragglers(one_step_input(step, {0.0}));
  EXPECT_EQ(r.slowest, 4);
  EXPECT_NEAR(r.cost_ms, 9.0, 1e-9);
  // waits from each tower's own start: tower 4 waits for nobody, tower 0 from 10 to 25
  EXPECT_NEAR(r.towers[4].wait_ms, 0.0, 1e-9);
  EXPECT_NEAR(r.towers[0].wait_ms, 15.0, 1e-9);
  EXPECT_NEAR(r.towers[3].wait_ms, 12.0, 1e-9);
}

TEST(Straggler, ASlowTowerInTheMiddleOfAProcessDelaysTheTowersAfterIt) {
  // the cpu backend's 3 towers in one process, forward f0 f1 f2 then backward b0 b1 b2: tower 1's
  // backward 3 ms longer pushes tower 2's whole backward later; a replay that moved only tower 1's
  // times would find the step still waiting for tower 2, and no cost
  StragglerInput in;
  in.sequential = true;
  in.towers_per_process = 3;
  for (int t = 0; t < 3; ++t) in.towers.push_back({t, 0, -1, "h", "", "", ""});
  in.sync_ms = {0.1};
  in.steps.assign(1, {});
  in.step_ms.assign(1, {});
  for (int s = 0; s < 5; ++s) {
    TowerStep a{0, 4, 6, {18}, {}, 33.1}, b{4, 4, 9, {27}, {}, 33.1}, c{8, 4, 6, {33}, {}, 33.1};
    in.steps[0].push_back({a, b, c});
    in.step_ms[0].push_back(33.1);
  }
  const auto r = analyze_stragglers(in);
  EXPECT_EQ(r.slowest, 1);
  EXPECT_NEAR(r.cost_ms, 3.0, 1e-9);
}

TEST(Straggler, NoiseAndThresholdAreFractionsOfTheCompute) {
  // every tower's compute over 5 steps: 10, 10.2, 9.8, 10.4, 9.6 ms (x its own scale): the median
  // absolute deviation is 0.2 ms, so the noise is 1.4826 x 0.2 / 10 = 2.9652% whatever the scale,
  // and the threshold 3 x that (above the 5% floor)
  StragglerInput in;
  const std::vector<double> compute = {10, 10.2, 9.8, 10.4, 9.6};
  for (int t = 0; t < 3; ++t) in.towers.push_back({t, t, t, "h", "", "", ""});
  in.sync_ms = {0.1};
  in.steps.assign(1, {});
  in.step_ms.assign(1, {});
  for (double c : compute) {
    std::vector<TowerStep> step;
    for (int t = 0; t < 3; ++t) {
      const double scale = 1 + 0.5 * t;  // towers of 10, 15 and 20 ms: the noise is relative
      TowerStep ts{0, 2 * scale, (c - 2) * scale, {}, {}, 0};
      ts.ready_ms = {c * scale};
      ts.released_ms = c * 2 + 0.1;
      step.push_back(ts);
    }
    in.steps[0].push_back(step);
    in.step_ms[0].push_back(c * 2 + 0.1);
  }
  const auto r = analyze_stragglers(in);
  EXPECT_NEAR(r.noise, 1.4826 * 0.2 / 10, 1e-9);
  EXPECT_NEAR(r.threshold, 3 * 1.4826 * 0.2 / 10, 1e-9);
  EXPECT_EQ(r.slowest, 2);
  EXPECT_EQ(r.fastest, 0);
  EXPECT_NEAR(r.towers[2].relative, 0.5, 1e-9);
}

TEST(Fabric, TwoLevelsWithOneNodeAreTheFlatModel) {
  const LinkModel nv{"nvlink4", 3600, 3}, ib{"ib-ndr", 400, 5};
  Fabric two_levels, flat_nv, flat_ib;  // named: GCC 12 misreads temporaries' strings as uninitialised
  two_levels.between = flat_ib.between = ib;
  two_levels.node = flat_nv.between = nv;
  two_levels.gpus_per_node = 8;
  for (double bytes : {1e3, 1e6, 1e8})
    for (int gpus : {2, 4, 8}) {
      std::string a1, a2;
      const double two = allreduce_ms(two_levels, bytes, gpus, &a1), flat = allreduce_ms(flat_nv, bytes, gpus, &a2);
      EXPECT_DOUBLE_EQ(two, flat) << bytes << " bytes, " << gpus;
      EXPECT_EQ(a1, a2);
    }
  // several nodes: the fast link inside each node makes the all-reduce faster than ib alone
  std::string alg;
  EXPECT_LT(allreduce_ms(two_levels, 1e8, 64, &alg), allreduce_ms(flat_ib, 1e8, 64, nullptr));
  EXPECT_EQ(alg, "2-level");
  EXPECT_EQ(allreduce_ms(two_levels, 1e8, 1, &alg), 0.0);
}

TEST(Fabric, FitsAnNcclTestsRunAndRefusesOtherFiles) {
  const std::string path = fmt::format("/tmp/stepbench-nccl-tests-{}.json", getpid());
  const double alpha_us = 6, beta_gbs = 40, n = 16;  // two hosts of 8
  nlohmann::json devices = nlohmann::json::array(), results = nlohmann::json::array();
  for (int r = 0; r < 16; ++r) devices.push_back({{"rank", r}, {"hostname", r < 8 ? "a" : "b"}, {"device", r % 8}});
  for (double s = 1024; s <= 1 << 30; s *= 4) {
    const double us = 2 * (n - 1) * alpha_us + 2 * (n - 1) / n * s / (beta_gbs * 1e3);
    results.push_back({{"size", s}, {"out_of_place", {{"time", us}, {"alg_bw", 0}, {"bus_bw", 0}}}});
  }
  std::ofstream(path) << nlohmann::json{
      {"version", 1},
      {"nccl_version", 22807},
      {"config", {{"devices", devices}}},
      {"results", results}}.dump();
  const auto f = fit_nccl_tests(path);
  EXPECT_EQ(f.ranks, 16);
  EXPECT_EQ(f.hosts, 2);
  EXPECT_NEAR(f.link.latency_us, alpha_us, 0.01 * alpha_us);
  EXPECT_NEAR(f.link.gbps / 8, beta_gbs, 0.01 * beta_gbs);
  EXPECT_LT(f.worst_residual, 1e-6);
  std::ofstream(path) << "{\"results\": []}";
  EXPECT_THROW(fit_nccl_tests(path), UsageError);
  std::ofstream(path) << "not json";
  EXPECT_THROW(fit_nccl_tests(path), UsageError);
  std::remove(path.c_str());
  EXPECT_THROW(fit_nccl_tests(path), UsageError);
}

TEST(StragglerTax, WidensWithTheCountAndTheSpread) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> d(0, 1);
  std::vector<double> narrow, wide;
  for (int i = 0; i < 300; ++i) {
    const double z = d(rng);
    narrow.push_back(20 + 0.2 * z);
    wide.push_back(20 + 0.4 * z);
  }
  EXPECT_EQ(straggler_tax(narrow, 1).hi_ms, 0.0);
  double last_hi = 0, last_width = -1;
  for (int n : {2, 8, 64, 1024, 16384}) {
    const auto t = straggler_tax(narrow, n);
    EXPECT_GT(t.hi_ms, last_hi) << n;
    EXPECT_GE(t.hi_ms - t.lo_ms, last_width - 1e-12) << n;
    EXPECT_LE(t.lo_ms, t.hi_ms);
    last_hi = t.hi_ms;
    last_width = t.hi_ms - t.lo_ms;
    const auto w = straggler_tax(wide, n);
    EXPECT_NEAR(w.hi_ms / t.hi_ms, 2.0, 1e-9) << n;  // twice the spread, twice the tax
    EXPECT_NEAR(w.lo_ms / t.lo_ms, 2.0, 1e-9) << n;
  }
  // 1024 normal draws' expected maximum is about 3.2 sigma above the median: inside the band
  const auto t = straggler_tax(narrow, 1024);
  EXPECT_LE(t.lo_ms, 0.2 * 3.2);
  EXPECT_GE(t.hi_ms, 0.2 * 3.2);
  EXPECT_LT(t.hi_ms - t.lo_ms, 0.3 * 0.2 * 3.2);  // 300 samples pin the spread to within about 15%
  // a rare hiccup (1 step in 100 at twice the time) widens the band upward only
  auto hiccups = narrow;
  for (std::size_t i = 0; i < hiccups.size(); i += 100) hiccups[i] = 40;
  EXPECT_GT(straggler_tax(hiccups, 1024).hi_ms, 3 * t.hi_ms);
  EXPECT_NEAR(straggler_tax(hiccups, 1024).lo_ms, t.lo_ms, 0.2 * t.lo_ms);
}

}  // namespace
}  // namespace stepbench
