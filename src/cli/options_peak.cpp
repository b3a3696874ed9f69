// --peak and --peak-cache (bench/peak.hpp): the device's GEMM peak that the summary's "of peak" line
// and --json's "peak" give the step's and the forward's model FLOP/s a share of.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "cli/options.hpp"
#include "tensor/error.hpp"

namespace stepbench::cli {

void add_peak_flags(CLI::App& app, Options& o) {
  app.add_option("--peak", o.peak,
                 "the device's peak that the step's and the forward's model FLOP/s are a share of: auto (the "
                 "cached figure for this machine and precision, else the backend's GEMM measured once, about a "
                 "second, and cached), measure (again, and cached), off, or a figure in TFLOP/s (a data sheet's)")
      ->capture_default_str();
  app.add_option("--peak-cache", o.peak_cache,
                 "where measured peaks are kept, keyed by device, libraries, threads and precision [default: "
                 "$XDG_CACHE_HOME/stepbench/peak.json, else ~/.cache/stepbench/peak.json]; none: measured every run");
}

void resolve_peak_flags(Options& o) {
  PeakOptions& p = o.bench.peak;
  const std::string& v = o.peak;
  if (v == "auto") {
    p.mode = PeakMode::automatic;
  } else if (v == "measure") {
    p.mode = PeakMode::measure;
  } else if (v == "off") {
    p.mode = PeakMode::off;
  } else {
    double x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x) || x <= 0 || x > 1e6)
      throw UsageError(fmt::format(
          "--peak {}: give auto, measure, off, or the device's peak in TFLOP/s (above 0, at most 1e6; e.g. 989.4 "
          "for an H100's dense bf16)",
          v));
    p.mode = PeakMode::given;
    p.given_tflops = x;
  }
  if (o.given("--peak-cache") && (p.mode == PeakMode::off || p.mode == PeakMode::given))
    throw UsageError(fmt::format("--peak-cache keeps measured peaks; --peak {} measures none: drop one of them", v));
  if (o.given("--peak-cache") && o.peak_cache.empty())
    throw UsageError("--peak-cache needs a file (or none, to measure every run)");
  if (o.bench.sweep() && (o.given("--peak") || o.given("--peak-cache")))
    throw UsageError("--peak and --peak-cache go with the phases' summary, not with --sweep-*: drop them");
  if (o.peak_cache == "none") {
    p.cache.clear();
  } else if (!o.peak_cache.empty()) {
    p.cache = o.peak_cache;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    p.cache = std::string(x) + "/stepbench/peak.json";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    p.cache = std::string(h) + "/.cache/stepbench/peak.json";
  }
}

}  // namespace stepbench::cli
