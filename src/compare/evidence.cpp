// The run-level evidence of stepbench compare (evidence.hpp).
#include "compare/evidence.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace stepbench::compare {

// cpu: the largest run-to-run sd measured, on a 2-core EPYC VM (tiny, 70 lone runs in a row on
// 2026-11-29, 30 of 5 and 40 of 8 repetitions): the sd of the log medians was 0.17 and 0.25
// forward, 0.27 and 0.35 step. The host moves the VM between speeds every second or so (within one
// process too: 1.3 ms steps, then 2.0), so runs land at 0.9, 1.3, 2.1 and up to 3.9 ms, a 4.7x
// between two runs of one binary, with a within-run cv of 1-5%. Of the 40 runs' 1560 ordered pairs,
// alpha 0.05 called 12.5% a regression at the 20% stated before, 5.7% at 30% and 3.5% at 35%. Two
// lone runs must then differ by exp(z(1 - alpha/m) sqrt(2) 35%) - 1 to be told apart: 126% for one
// phase, 164% for two. cuda: not measured across runs yet; 5%.
double default_run_noise(const std::string& backend) { return backend == "cuda" ? 0.05 : 0.35; }

// cpu: ab.sh's A/A rounds of the default run (Inception-v3, batch 4, the reduced cpu run) on a 2-core
// AMD EPYC VM, 9 rounds on 2026-12-01: the sd of the rounds' log ratios 11.4% forward, 11.9%
// forward_train, 11.6% forward_backward, 12.6% step (20% the 10 ms update); their rounds' medians
// spread by 6.4-11.6% from round to round, so pairing two runs 20 s apart cancelled nothing there
// (sqrt(2) x the spread: uncorrelated). 13%: the step's, rounded up. cuda: not measured yet; a guess,
// 2%, less than its stated run noise.
double default_round_noise(const std::string& backend) { return backend == "cuda" ? 0.02 : 0.13; }

namespace {

std::vector<double> round_medians(const Series& s, int rounds) {
  std::vector<double> med(static_cast<std::size_t>(rounds), NAN);
  for (int k = 1; k <= rounds; ++k) {
    std::vector<double> v;
    for (std::size_t i = 0; i < s.ms.size() && i < s.round.size(); ++i)
      if (s.round[i] == k) v.push_back(s.ms[i]);
    if (!v.empty()) med[static_cast<std::size_t>(k - 1)] = median(v);
  }
  return med;
}

// A stated (not measured) noise: e.d against a normal with standard error `se` (0: any change).
void normal_test(RunEvidence& e, double se, double alpha, std::size_t family) {
  e.p_slower = se > 0 ? 1 - normal_cdf(e.d / se) : (e.d > 0 ? 0 : 1);
  e.p_faster = se > 0 ? normal_cdf(e.d / se) : (e.d < 0 ? 0 : 1);
  e.crit = normal_quantile(1 - alpha / static_cast<double>(family)) * se;
  const double half = normal_quantile(1 - alpha / 2) * se;
  e.ratio = {std::exp(e.d - half), std::exp(e.d + half)};
}

}  // namespace

// ab.sh's rounds: round k of each side ran in the same time slot; their medians' log ratios are the
// paired observations.
RunEvidence rounds_evidence(const Series& b, const Series& h, int rounds, double alpha, std::size_t family) {
  RunEvidence e;
  const auto mb = round_medians(b, rounds), mh = round_medians(h, rounds);
  std::vector<double> d;
  for (std::size_t k = 0; k < mb.size() && k < mh.size(); ++k)
    if (std::isfinite(mb[k]) && std::isfinite(mh[k]) && mb[k] > 0 && mh[k] > 0) d.push_back(std::log(mh[k] / mb[k]));
  e.n_base = e.n_head = d.size();
  e.source = fmt::format("the spread of {} paired rounds", d.size());
  if (d.size() < 3) return e;
  e.usable = true;
  e.d = median(d);
  e.p_slower = wilcoxon_signed_rank(d, Alternative::greater).p;
  e.p_faster = wilcoxon_signed_rank(d, Alternative::less).p;
  e.rounds_sd = mean_sd(d).sd;
  const double n = static_cast<double>(d.size());
  e.crit = student_t_quantile(1 - alpha / static_cast<double>(family), n - 1) * e.rounds_sd / std::sqrt(n);
  e.ratio = bootstrap_paired_median(d, 1 - alpha);
  return e;
}

// A run against the history: the earlier runs' medians since the last change point give the
// run-to-run noise; HEAD must fall outside their prediction interval.
RunEvidence history_evidence(const Series& b, double head_ms, double alpha, std::size_t family, double fallback,
                             const std::string& fallback_source) {
  RunEvidence e;
  std::vector<double> x;
  for (double m : b.run_medians)
    if (std::isfinite(m) && m > 0) x.push_back(std::log(m));
  const auto cps = change_points(x, kChangeAlpha);
  if (!cps.empty()) x.erase(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(cps.back().index));
  e.n_base = x.size();
  e.n_head = 1;
  if (x.empty() || !(head_ms > 0)) return e;
  e.usable = true;
  const MeanSd ms = mean_sd(x);
  const double n = static_cast<double>(x.size());
  e.d = std::log(head_ms) - ms.mean;
  if (x.size() >= 3 && ms.sd > 0) {
    e.noise = ms.sd;
    e.source = fmt::format("the spread of {} earlier runs{}", x.size(), cps.empty() ? "" : " since the last change");
    const double se = ms.sd * std::sqrt(1 + 1 / n);
    e.p_slower = 1 - student_t_cdf(e.d / se, n - 1);
    e.p_faster = student_t_cdf(e.d / se, n - 1);
    e.crit = student_t_quantile(1 - alpha / static_cast<double>(family), n - 1) * se;
    const double half = student_t_quantile(1 - alpha / 2, n - 1) * se;
    e.ratio = {std::exp(e.d - half), std::exp(e.d + half)};
  } else {  // too few runs to measure the noise, or no spread among them: the stated default
    e.noise = fallback;
    e.source = x.size() >= 3 ? fmt::format("{} ({} earlier runs, all with one median)", fallback_source, x.size())
                             : fmt::format("{} ({} earlier run{}: too few to measure it)", fallback_source, x.size(),
                                           x.size() == 1 ? "" : "s");
    normal_test(e, fallback * std::sqrt(1 + 1 / n), alpha, family);
  }
  return e;
}

// Two lone runs: their medians differ by the run-to-run noise of each, sqrt(2) sigma.
RunEvidence runs_evidence(double base_ms, double head_ms, double alpha, std::size_t family, double sigma,
                          const std::string& source) {
  RunEvidence e;
  e.n_base = e.n_head = 1;
  if (!(base_ms > 0 && head_ms > 0)) return e;
  e.usable = true;
  e.noise = sigma;
  e.source = source;
  e.d = std::log(head_ms / base_ms);
  normal_test(e, std::sqrt(2.0) * sigma, alpha, family);
  return e;
}

// The indices of a series' finite positive medians, and their logs.
std::pair<std::vector<std::size_t>, std::vector<double>> log_medians(const std::vector<double>& med) {
  std::pair<std::vector<std::size_t>, std::vector<double>> r;
  for (std::size_t i = 0; i < med.size(); ++i)
    if (std::isfinite(med[i]) && med[i] > 0) r.first.push_back(i), r.second.push_back(std::log(med[i]));
  return r;
}

std::map<std::string, std::string> pool_since_change(Run& base) {
  std::map<std::string, std::string> windows;
  const std::size_t n = base.history.size();
  for (auto& [key, s] : base.benchmarks) {
    const auto [at, x] = log_medians(s.run_medians);
    if (at.empty()) continue;
    const auto cps = change_points(x, kChangeAlpha);
    const std::size_t since = cps.empty() ? 0 : cps.back().index;  // into at / x
    const std::size_t from = std::max(since, at.size() > base.history_last ? at.size() - base.history_last : 0);
    s.ms.clear();
    s.throttled = 0;
    for (std::size_t k = from; k < at.size(); ++k) {
      const std::size_t run = at[k];
      if (run < s.run_ms.size()) s.ms.insert(s.ms.end(), s.run_ms[run].begin(), s.run_ms[run].end());
      if (run < s.run_throttled.size()) s.throttled += s.run_throttled[run];
    }
    const std::size_t first = at[from] + 1, last = at.back() + 1;  // 1-based, as the report's runs
    const std::string runs =
        first == last ? fmt::format("run {} of {}", first, n) : fmt::format("runs {}-{} of {}", first, last, n);
    windows[key] = cps.empty()
                       ? fmt::format("{}{}", runs, from > 0 ? fmt::format(", the last {}", at.size() - from) : "")
                       : fmt::format("{}, since the change point at run {} ({}){}", runs, at[since] + 1,
                                     base.history[at[since]].revision,
                                     from > since ? fmt::format(", the last {}", at.size() - from) : "");
  }
  return windows;
}

// About how many ab.sh rounds would find a change of `threshold` with probability `power`, with
// rounds whose log ratios spread by `sd`: the fewest n whose test can reach alpha over the family and
// for which the one-sided t test at alpha / family has that power against the threshold,
// (t(1 - alpha / family) + t(power)) sd / sqrt(n) <= log(1 + threshold), n - 1 degrees of freedom;
// then over the signed-rank test's efficiency against t under normal noise (3 / pi, Pitman), which
// needs that many more rounds. 1000: more than that.
std::size_t rounds_for(double threshold, double sd, double alpha, std::size_t family, double power) {
  const double target = std::log1p(threshold), a = alpha / static_cast<double>(family);
  const double z = normal_quantile(1 - a) + normal_quantile(power);  // t's quantiles are above: no n below
  const double n0 = std::ceil(z * sd / target * (z * sd / target));
  if (!(n0 <= 1000)) return 1000;
  for (auto n = std::max<std::size_t>(3, static_cast<std::size_t>(n0)); n <= 1000; ++n) {
    const double nn = static_cast<double>(n);
    if ((student_t_quantile(1 - a, nn - 1) + student_t_quantile(power, nn - 1)) * sd / std::sqrt(nn) > target) continue;
    constexpr double kSignedRankEfficiency = 3 / 3.14159265358979323846;
    auto k = static_cast<std::size_t>(std::ceil(nn / kSignedRankEfficiency));
    while (k <= 1000 && static_cast<double>(family) * smallest_signed_rank_p(k) >= alpha) ++k;
    return std::min<std::size_t>(k, 1000);
  }
  return 1000;
}

// Change points of each phase's series: the history's run medians, then HEAD's. A slowdown beyond
// the threshold that HEAD sits after (the last change of the series) makes HEAD's row a regression.
std::vector<HistoryChange> history_changes(const Run& base, const Run& head, std::vector<Row>& rows, const Options& o) {
  std::vector<HistoryChange> out;
  for (auto& r : rows) {
    if (r.per_layer) continue;
    auto bi = base.benchmarks.find(r.key);
    if (bi == base.benchmarks.end()) continue;
    std::vector<double> x;
    std::vector<std::size_t> at;  // index into base.history, or history.size() for HEAD
    for (std::size_t i = 0; i < bi->second.run_medians.size(); ++i)
      if (const double m = bi->second.run_medians[i]; std::isfinite(m) && m > 0) {
        x.push_back(std::log(m));
        at.push_back(i);
      }
    if (r.head_ms > 0) {
      x.push_back(std::log(r.head_ms));
      at.push_back(base.history.size());
    }
    const auto cps = change_points(x, kChangeAlpha);
    for (std::size_t c = 0; c < cps.size(); ++c) {
      HistoryChange h;
      h.key = r.key;
      h.run = at[cps[c].index];  // 3 runs on either side: never HEAD's own, the series' last
      if (h.run >= base.history.size()) throw CompareError("a change point at HEAD (a bug: 3 runs must follow one)");
      h.revision = base.history[h.run].revision;
      h.time = base.history[h.run].time;
      h.change = cps[c].change;
      h.lo = cps[c].ratio.lo - 1;
      h.hi = cps[c].ratio.hi - 1;
      h.p = cps[c].p;
      out.push_back(h);
      // HEAD still above the level before the change (not back down: a fix after a slowdown is
      // not a regression), and the row not decided otherwise (improvement, unstable)
      const std::size_t from = c > 0 ? cps[c - 1].index : 0;
      double before = 0;
      for (std::size_t i = from; i < cps[c].index; ++i) before += x[i];
      before /= static_cast<double>(cps[c].index - from);
      const bool head_above = r.head_ms > 0 && std::log(r.head_ms) - before > std::log1p(o.threshold);
      const bool last = c + 1 == cps.size();
      if (last && h.change > o.threshold && h.lo > 0 && head_above &&
          (r.status == Status::no_change || r.status == Status::unknown)) {
        r.status = Status::regression;
        r.reason = fmt::format(
            "the series slowed by {:+.1f}% [{:+.1f}%, {:+.1f}%] at run {} ({}{}), and HEAD is after "
            "it (change point p {:.2g})",
            100 * h.change, 100 * h.lo, 100 * h.hi, h.run + 1, h.revision, h.time.empty() ? "" : ", " + h.time, h.p);
      }
    }
  }
  return out;
}

}  // namespace stepbench::compare
