#include "compare/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace stepbench::compare {

namespace {

// The median of v, reordering v: the bootstraps below take it thousands of times per comparison of
// a buffer they refill anyway (a copy per resample was most of the compare tests' time, and 56x
// that under AddressSanitizer).
double median_in_place(std::vector<double>& v) {
  if (v.empty()) return NAN;
  const std::size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2), v.end());
  const double hi = v[n / 2];
  if (n % 2) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2)));
}

}  // namespace

double median(std::vector<double> v) { return median_in_place(v); }

double relative_spread(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = median(v);
  std::vector<double> d;
  d.reserve(v.size());
  for (double x : v) d.push_back(std::abs(x - m));
  return m > 0 ? 1.4826 * median(d) / m : 0;
}

namespace {

// The q-quantile of sorted values, interpolated linearly (numpy's default).
double percentile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto i = static_cast<std::size_t>(std::floor(pos));
  const double f = pos - static_cast<double>(i);
  return i + 1 < sorted.size() ? sorted[i] * (1 - f) + sorted[i + 1] * f : sorted[i];
}

// Average ranks (1-based) of the concatenation of x and y, as scipy.stats.rankdata; also the tie
// term sum(t^3 - t) over groups of equal values.
std::vector<double> ranks(const std::vector<double>& xy, double* tie_term) {
  const std::size_t n = xy.size();
  std::vector<std::size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return xy[a] < xy[b]; });
  std::vector<double> r(n);
  *tie_term = 0;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j + 1 < n && xy[idx[j + 1]] == xy[idx[i]]) ++j;
    const double avg = 0.5 * static_cast<double>(i + j) + 1.0;
    for (std::size_t k = i; k <= j; ++k) r[idx[k]] = avg;
    const double t = static_cast<double>(j - i + 1);
    *tie_term += t * t * t - t;
    i = j + 1;
  }
  return r;
}

// P(U >= k) under the null for sizes m, n: the number of arrangements with U = u counted by the
// recurrence f(m, n, u) = f(m - 1, n, u - n) + f(m, n - 1, u), over C(m + n, m).
double exact_sf(std::int64_t k, std::size_t m, std::size_t n) {
  const std::size_t umax = m * n;
  if (k <= 0) return 1;
  if (static_cast<std::size_t>(k) > umax) return 0;
  // f[j][u] for the current i (the size of the first sample), j = 0..n
  std::vector<std::vector<double>> f(n + 1, std::vector<double>(umax + 1, 0.0));
  for (std::size_t j = 0; j <= n; ++j) f[j][0] = 1;  // i = 0: one arrangement, U = 0
  for (std::size_t i = 1; i <= m; ++i) {
    std::vector<std::vector<double>> g(n + 1, std::vector<double>(umax + 1, 0.0));
    g[0][0] = 1;  // j = 0: U = 0
    for (std::size_t j = 1; j <= n; ++j)
      for (std::size_t u = 0; u <= i * j; ++u) g[j][u] = (u >= j ? f[j][u - j] : 0.0) + g[j - 1][u];
    f.swap(g);
  }
  double tail = 0, total = 0;
  for (std::size_t u = 0; u <= umax; ++u) {
    total += f[n][u];
    if (u >= static_cast<std::size_t>(k)) tail += f[n][u];
  }
  return tail / total;
}

}  // namespace

UTest mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y, Alternative alt, bool exact) {
  UTest t;
  const std::size_t n1 = x.size(), n2 = y.size();
  if (n1 == 0 || n2 == 0) return t;
  std::vector<double> xy(x);
  xy.insert(xy.end(), y.begin(), y.end());
  double tie_term = 0;
  const auto r = ranks(xy, &tie_term);
  const double r1 = std::accumulate(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(n1), 0.0);
  const double d1 = static_cast<double>(n1), d2 = static_cast<double>(n2);
  t.u = r1 - d1 * (d1 + 1) / 2;
  const double u = alt == Alternative::greater ? t.u : d1 * d2 - t.u;
  t.exact = exact;
  if (exact) {
    // U truncated as scipy does (a tie makes it x.5); the null distribution of U is symmetric in
    // the two sizes: count over the smaller one
    t.p = exact_sf(static_cast<std::int64_t>(u), std::max(n1, n2), std::min(n1, n2));
  } else {
    const double n = d1 + d2;
    const double s = std::sqrt(d1 * d2 / 12 * ((n + 1) - tie_term / (n * (n - 1))));
    const double z = (u - d1 * d2 / 2 - 0.5) / s;
    t.p = s > 0 ? 0.5 * std::erfc(z / std::sqrt(2.0)) : 1.0;
  }
  t.p = std::clamp(t.p, 0.0, 1.0);
  return t;
}

UTest mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y, Alternative alt) {
  std::vector<double> xy(x);
  xy.insert(xy.end(), y.begin(), y.end());
  std::sort(xy.begin(), xy.end());
  const bool ties = std::adjacent_find(xy.begin(), xy.end()) != xy.end();
  return mann_whitney_u(x, y, alt, !(x.size() > 8 && y.size() > 8) && !ties);
}

double smallest_p(std::size_t n1, std::size_t n2) {
  double c = 1;  // C(n1 + n2, n1), built up as a product
  for (std::size_t i = 1; i <= n1; ++i) c = c * static_cast<double>(n2 + i) / static_cast<double>(i);
  return 1.0 / c;
}

std::vector<double> holm(const std::vector<double>& p) {
  const std::size_t m = p.size();
  std::vector<std::size_t> idx(m);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return p[a] < p[b]; });
  std::vector<double> adj(m);
  double running = 0;
  for (std::size_t k = 0; k < m; ++k) {
    running = std::max(running, std::min(1.0, static_cast<double>(m - k) * p[idx[k]]));
    adj[idx[k]] = running;
  }
  return adj;
}

Interval bootstrap_median_ratio(const std::vector<double>& base, const std::vector<double>& head, double confidence,
                                int resamples, std::uint64_t seed) {
  Interval iv{NAN, NAN};
  if (base.empty() || head.empty() || resamples < 1) return iv;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> pb(0, base.size() - 1), ph(0, head.size() - 1);
  std::vector<double> ratios, b(base.size()), h(head.size());
  ratios.reserve(static_cast<std::size_t>(resamples));
  for (int r = 0; r < resamples; ++r) {
    for (auto& v : b) v = base[pb(rng)];
    for (auto& v : h) v = head[ph(rng)];
    ratios.push_back(median_in_place(h) / median_in_place(b));
  }
  std::sort(ratios.begin(), ratios.end());
  const double a = (1 - confidence) / 2;
  iv.lo = percentile(ratios, a);
  iv.hi = percentile(ratios, 1 - a);
  return iv;
}

namespace {

// The number of subsets of {1..n} for each rank sum 0..n(n+1)/2 (the exact null of the signed-rank
// statistic, times 2^n).
std::vector<double> signed_rank_counts(std::size_t n) {
  const std::size_t top = n * (n + 1) / 2;
  std::vector<double> c(top + 1, 0.0);
  c[0] = 1;
  for (std::size_t k = 1; k <= n; ++k)
    for (std::size_t s = k * (k + 1) / 2; s >= k; --s) c[s] += c[s - k];
  return c;
}

}  // namespace

SignedRank wilcoxon_signed_rank(const std::vector<double>& d, Alternative alt) {
  SignedRank r;
  if (d.empty()) return r;
  const bool zeros = std::any_of(d.begin(), d.end(), [](double x) { return x == 0; });
  r.exact = d.size() <= 50 && !zeros;
  std::vector<double> v;
  for (double x : d)
    if (x != 0 || r.exact) v.push_back(x);
  r.n = v.size();
  if (v.empty()) return r;
  std::vector<double> a(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) a[i] = std::abs(v[i]);
  double tie_term = 0;
  const auto rk = ranks(a, &tie_term);
  double plus = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] > 0) plus += rk[i];
  r.t = plus;
  const double n = static_cast<double>(v.size());
  if (r.exact) {
    const auto c = signed_rank_counts(v.size());
    const auto k = static_cast<std::size_t>(plus);  // scipy: int(r_plus)
    double total = 0, tail = 0;
    for (std::size_t s = 0; s < c.size(); ++s) {
      total += c[s];
      if (alt == Alternative::greater ? s >= k : s <= k) tail += c[s];
    }
    r.p = tail / total;
  } else {
    const double mn = n * (n + 1) / 4;
    // scipy subtracts 0.5 sum(t (t^2 - 1)) over the groups of tied ranks: the same as tie_term / 2
    const double se = std::sqrt((n * (n + 1) * (2 * n + 1) - 0.5 * tie_term) / 24);
    const double z = se > 0 ? (plus - mn) / se : 0;
    r.p = alt == Alternative::greater ? 1 - normal_cdf(z) : normal_cdf(z);
  }
  r.p = std::clamp(r.p, 0.0, 1.0);
  return r;
}

double smallest_signed_rank_p(std::size_t n) {
  return std::ldexp(1.0, -static_cast<int>(std::min<std::size_t>(n, 1000)));
}

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

double normal_quantile(double p) {
  if (p <= 0) return -INFINITY;
  if (p >= 1) return INFINITY;
  double lo = -40, hi = 40;
  for (int i = 0; i < 200 && hi - lo > 1e-13; ++i) {
    const double mid = 0.5 * (lo + hi);
    (normal_cdf(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

namespace {

// The regularised incomplete beta function I_x(a, b) (Numerical Recipes' continued fraction).
double beta_cf(double a, double b, double x) {
  const double tiny = 1e-300;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::abs(d) < tiny) d = tiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 300; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    d = 1 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    d = 1 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::abs(del - 1) < 1e-15) break;
  }
  return h;
}
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double lbt = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  const double bt = std::exp(lbt);
  if (x < (a + 1) / (a + b + 2)) return bt * beta_cf(a, b, x) / a;
  return 1 - bt * beta_cf(b, a, 1 - x) / b;
}

}  // namespace

double student_t_cdf(double t, double df) {
  if (!(df > 0)) return NAN;
  const double x = df / (df + t * t);
  const double tail = 0.5 * incomplete_beta(df / 2, 0.5, x);
  return t >= 0 ? 1 - tail : tail;
}

double student_t_quantile(double p, double df) {
  if (p <= 0) return -INFINITY;
  if (p >= 1) return INFINITY;
  double lo = -1e6, hi = 1e6;
  for (int i = 0; i < 300 && hi - lo > 1e-12 * std::max(1.0, std::abs(lo)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

MeanSd mean_sd(const std::vector<double>& v) {
  MeanSd m{NAN, NAN};
  if (v.empty()) return m;
  m.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  if (v.size() < 2) return m;
  double ss = 0;
  for (double x : v) ss += (x - m.mean) * (x - m.mean);
  m.sd = std::sqrt(ss / static_cast<double>(v.size() - 1));
  return m;
}

namespace {

// The segment [i, j) of x whose two-sample t statistic against the rest (pooled variance) is the
// largest: circular binary segmentation's statistic. A single change is a segment that reaches an
// end (i = 0 or j = n); a stretch of runs that moved and came back (a regression and its fix) is a
// segment inside, which a single split sees only diluted by the runs after it. The segment and each
// part outside it hold at least min_size runs (or none). `inside` false: the splits [0, j) only, O(n);
// true: the stretches with runs on both sides, O(n^2); from prefix sums.
struct Segment {
  double t = -1;
  std::size_t i = 0, j = 0;
};
Segment best_segment(const std::vector<double>& x, std::size_t min_size, bool inside, std::vector<double>& sums,
                     std::vector<double>& squares) {
  const std::size_t n = x.size();
  sums.assign(n + 1, 0.0);
  squares.assign(n + 1, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    sums[k + 1] = sums[k] + x[k];
    squares[k + 1] = squares[k] + x[k] * x[k];
  }
  const double s = sums[n], q = squares[n];
  Segment best;
  const auto consider = [&](std::size_t i, std::size_t j) {
    const double n1 = static_cast<double>(j - i), n2 = static_cast<double>(n - (j - i));
    const double s1 = sums[j] - sums[i], q1 = squares[j] - squares[i];
    const double m1 = s1 / n1, m2 = (s - s1) / n2;
    const double ss = (q1 - n1 * m1 * m1) + ((q - q1) - n2 * m2 * m2);
    const double var = std::max(ss, 0.0) / (n1 + n2 - 2);
    const double se = std::sqrt(var * (1 / n1 + 1 / n2));
    const double t = se > 0 ? std::abs(m2 - m1) / se : (m2 != m1 ? INFINITY : 0);
    if (t > best.t) best = {t, i, j};
  };
  if (!inside) {  // single splits: [0, j) against [j, n)
    for (std::size_t j = min_size; j + min_size <= n; ++j) consider(0, j);
    return best;
  }
  for (std::size_t i = min_size; i + 2 * min_size <= n; ++i)
    for (std::size_t j = i + min_size; j + min_size <= n; ++j) consider(i, j);
  return best;
}

// A change between the runs a (before) and b (after): exp(mean b - mean a) - 1, Welch's interval.
ChangePoint change_between(const std::vector<double>& x, std::size_t lo, std::size_t at, std::size_t hi, double p,
                           double confidence) {
  const std::vector<double> a(x.begin() + static_cast<std::ptrdiff_t>(lo), x.begin() + static_cast<std::ptrdiff_t>(at)),
      b(x.begin() + static_cast<std::ptrdiff_t>(at), x.begin() + static_cast<std::ptrdiff_t>(hi));
  ChangePoint c;
  c.index = at;
  c.p = p;
  const MeanSd ma = mean_sd(a), mb = mean_sd(b);
  const double na = static_cast<double>(a.size()), nb = static_cast<double>(b.size());
  const double va = ma.sd * ma.sd / na, vb = mb.sd * mb.sd / nb;
  const double df = (va + vb) * (va + vb) / (va * va / (na - 1) + vb * vb / (nb - 1));
  const double half =
      student_t_quantile(1 - (1 - confidence) / 2, std::isfinite(df) && df > 0 ? df : na + nb - 2) * std::sqrt(va + vb);
  c.change = std::exp(mb.mean - ma.mean) - 1;
  c.ratio = {std::exp(mb.mean - ma.mean - half), std::exp(mb.mean - ma.mean + half)};
  return c;
}

// The permutation test of a segment statistic t: the share of shuffles of x whose best statistic of
// the same kind reaches t, stopped once as many reach it as make p >= alpha (the verdict the full
// count would give: the count only grows).
double permutation_p(const std::vector<double>& x, double t, std::size_t min_size, bool inside, double alpha,
                     int permutations, std::mt19937_64& rng, std::vector<double>& sums, std::vector<double>& squares) {
  const double enough = alpha * (1.0 + permutations) - 1;
  int as_large = 0;
  std::vector<double> perm(x);
  for (int k = 0; k < permutations && as_large < enough; ++k) {
    std::shuffle(perm.begin(), perm.end(), rng);
    if (best_segment(perm, min_size, inside, sums, squares).t >= t) ++as_large;
  }
  return (1.0 + as_large) / (1.0 + permutations);
}

}  // namespace

std::vector<ChangePoint> change_points(const std::vector<double>& log_x, double alpha, double confidence,
                                       std::size_t min_size, int permutations, std::uint64_t seed) {
  std::vector<ChangePoint> found;
  min_size = std::max<std::size_t>(min_size, 2);
  std::mt19937_64 rng(seed);
  std::vector<double> sums, squares;
  std::vector<std::pair<std::size_t, std::size_t>> todo = {{0, log_x.size()}};  // [lo, hi)
  while (!todo.empty()) {
    const auto [lo, hi] = todo.back();
    todo.pop_back();
    if (hi - lo < 2 * min_size) continue;
    std::vector<double> seg(log_x.begin() + static_cast<std::ptrdiff_t>(lo),
                            log_x.begin() + static_cast<std::ptrdiff_t>(hi));
    // two statistics, each tested at alpha / 2: the best single split (a step), then, where that
    // finds none, the best stretch inside (runs that moved and came back)
    Segment best;
    double p = 1;
    for (bool inside : {false, true}) {
      best = best_segment(seg, min_size, inside, sums, squares);
      if (!(best.t > 0)) continue;
      p = permutation_p(seg, best.t, min_size, inside, alpha / 2, permutations, rng, sums, squares);
      if (p < alpha / 2) break;
    }
    if (!(p < alpha / 2)) continue;
    const std::size_t i = lo + best.i, j = lo + best.j;
    if (i > lo) {
      found.push_back(change_between(log_x, lo, i, j, p, confidence));
      todo.emplace_back(lo, i);
    }
    if (j < hi) {
      found.push_back(change_between(log_x, i, j, hi, p, confidence));
      todo.emplace_back(j, hi);
    }
    todo.emplace_back(i, j);
  }
  std::sort(found.begin(), found.end(), [](const ChangePoint& a, const ChangePoint& b) { return a.index < b.index; });
  return found;
}

Interval bootstrap_paired_median(const std::vector<double>& d, double confidence, int resamples, std::uint64_t seed) {
  Interval iv{NAN, NAN};
  if (d.empty() || resamples < 1) return iv;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, d.size() - 1);
  std::vector<double> meds, r(d.size());
  meds.reserve(static_cast<std::size_t>(resamples));
  for (int k = 0; k < resamples; ++k) {
    for (auto& v : r) v = d[pick(rng)];
    meds.push_back(median_in_place(r));
  }
  std::sort(meds.begin(), meds.end());
  const double a = (1 - confidence) / 2;
  iv.lo = std::exp(percentile(meds, a));
  iv.hi = std::exp(percentile(meds, 1 - a));
  return iv;
}

}  // namespace stepbench::compare
