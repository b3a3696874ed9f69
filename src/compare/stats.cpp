#include "compare/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace stepbench::compare {

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  const std::size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2), v.end());
  const double hi = v[n / 2];
  if (n % 2) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2)));
}

double relative_spread(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = median(v);
  std::vector<double> d;
  d.reserve(v.size());
  for (double x : v) d.push_back(std::abs(x - m));
  return m > 0 ? 1.4826 * median(d) / m : 0;
}

namespace {

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
    ratios.push_back(median(h) / median(b));
  }
  std::sort(ratios.begin(), ratios.end());
  const double a = (1 - confidence) / 2;
  auto at = [&](double q) {
    const double pos = q * static_cast<double>(ratios.size() - 1);
    const auto i = static_cast<std::size_t>(std::floor(pos));
    const double f = pos - static_cast<double>(i);
    return i + 1 < ratios.size() ? ratios[i] * (1 - f) + ratios[i + 1] * f : ratios[i];
  };
  iv.lo = at(a);
  iv.hi = at(1 - a);
  return iv;
}

}  // namespace stepbench::compare
