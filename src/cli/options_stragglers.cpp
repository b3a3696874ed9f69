// --straggler-top and --slow-tower (bench/straggler.hpp): the summary's list of the slowest towers,
// and the fault that makes one tower slower to see what a straggler costs.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <string_view>

#include "cli/options.hpp"
#include "tensor/error.hpp"

namespace stepbench::cli {
namespace {

template <class T>
bool parse_slow_number(std::string_view s, T& v) {
  const auto* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, v);
  return ec == std::errc() && p == end;
}

}  // namespace

void add_straggler_flags(CLI::App& app, Options& o) {
  app.add_option("--straggler-top", o.bench.straggler_top,
                 "with two towers or more: the summary lists this many towers, slowest first")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--slow-tower", o.slow_tower,
                 "a fault to see what a straggler costs: T:FACTOR holds tower T (rank x --gpus + index) at each "
                 "backward for (FACTOR - 1) x its forward + backward (measured after warm-up), so that it computes "
                 "FACTOR times as long; T:Nms holds it N ms");
}

void resolve_stragglers(Options& o) {
  BenchConfig& b = o.bench;
  if (o.given("--straggler-top") && b.sweep())
    throw UsageError("--straggler-top lists towers of the phases' step, not of --sweep-*: drop one of them");
  b.straggler_top_given = o.given("--straggler-top");
  if (o.slow_tower.empty() && !o.given("--slow-tower")) return;
  const std::string& s = o.slow_tower;
  const auto colon = s.find(':');
  const std::string_view tower = std::string_view(s).substr(0, colon);
  std::string_view amount = colon == std::string::npos ? "" : std::string_view(s).substr(colon + 1);
  const bool ms = amount.size() > 2 && amount.substr(amount.size() - 2) == "ms";
  if (ms) amount.remove_suffix(2);
  int t = -1;
  double v = 0;
  if (!parse_slow_number(tower, t) || t < 0 || !parse_slow_number(amount, v) || !std::isfinite(v))
    throw UsageError(
        fmt::format("--slow-tower {}: give TOWER:FACTOR (e.g. 1:1.5) or TOWER:Nms (e.g. 1:20ms), "
                    "TOWER counted over every process from 0",
                    s));
  if (ms ? v <= 0 || v > 1e6 : v <= 1 || v > 100)
    throw UsageError(
        fmt::format("--slow-tower {}: {} (a slower tower: a factor above 1 and at most 100, or a delay "
                    "above 0 ms and at most 1e6 ms)",
                    s, ms ? "the delay is out of range" : "the factor is out of range"));
  if (b.sweep()) throw UsageError("--slow-tower applies to the phases' step, not to --sweep-*: drop one of them");
  b.slow_tower = t;
  (ms ? b.slow_ms : b.slow_factor) = v;
}

}  // namespace stepbench::cli
