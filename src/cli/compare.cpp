// stepbench compare: the regression gate's command line (the statistics are in src/compare).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "compare/compare.hpp"
#include "tensor/error.hpp"

namespace stepbench::cli {
namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!(f << text)) throw UsageError(fmt::format("cannot write {}; give a path in a writable folder", path));
}

}  // namespace

int compare_main(int argc, char** argv) {
  CLI::App app{
      "stepbench compare: is HEAD slower than BASE? A run is one observation: separate runs differ by more than one "
      "run's repetitions do, so a change must exceed that run-to-run noise. ab.sh's interleaved rounds are paired "
      "(signed-rank test over the rounds); a history gives the noise (and its change points); two lone runs are "
      "judged with a stated default noise per backend (--run-noise). Without enough evidence a phase is 'unknown', "
      "with the smallest change the comparison could show and what to run to decide. Names the layers that moved "
      "when both runs have --per-layer timings.\n"
      "Exit status: 0 no regression (unknown included, unless --fail-on-unknown), 1 a regression, 2 a usage "
      "error.\n"
      "  stepbench compare BASE.json HEAD.json [--markdown FILE] [--json FILE]\n"
      "  stepbench compare --history runs.jsonl HEAD.json   (against earlier runs on this machine)\n"
      "  scripts/ab.sh BASE_REV HEAD_REV -- FLAGS           (interleaved rounds: the gate to use in CI)",
      "stepbench compare"};
  std::vector<std::string> files;
  compare::Options o;
  double threshold_pct = 100 * o.threshold, run_noise_pct = -1, round_noise_pct = -1;
  std::string markdown, json_out, history;
  int last = 5;
  app.add_option("files", files, "BASE.json HEAD.json (stepbench --json output), or HEAD.json with --history")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--threshold", threshold_pct, "the smallest change in percent reported as a regression")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--alpha", o.alpha, "family-wise error rate (Holm) and 1 - the intervals' confidence")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 0.5));
  app.add_option("--min-repetitions", o.min_repetitions, "fewer repetitions on a side: insufficient data")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000000));
  app.add_option("--run-noise", run_noise_pct,
                 fmt::format("the run-to-run noise in percent (relative sd of a run's median) for two lone runs and "
                             "a short history; default: {:g} on the cpu backend, {:g} on cuda",
                             100 * compare::default_run_noise("cpu"), 100 * compare::default_run_noise("cuda")))
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--round-noise", round_noise_pct,
                 fmt::format("ab.sh's paired noise in percent (the sd of its rounds' log ratios), which sizes the "
                             "rounds the advice names after two lone runs or a history; default: {:g} on the cpu "
                             "backend, {:g} on cuda",
                             100 * compare::default_round_noise("cpu"), 100 * compare::default_round_noise("cuda")))
      ->check(CLI::Range(0.0, 100.0));
  app.add_flag("--fail-on-unknown", o.fail_on_unknown,
               "exit 1 when a phase's verdict is unknown (the evidence cannot tell a change of --threshold) or "
               "insufficient data");
  app.add_option("--markdown", markdown, "also write the report as markdown (e.g. $GITHUB_STEP_SUMMARY)");
  app.add_option("--json", json_out, "also write the report as JSON");
  app.add_option("--history", history, "compare HEAD.json with earlier runs in this file (stepbench --history)")
      ->check(CLI::ExistingFile);
  app.add_option("--last", last,
                 "with --history: the within-run test's base pools at most the last N runs since the last change "
                 "point")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  if (auto rc = parse_args(app, argc, argv, 2, "stepbench compare")) return *rc;
  o.threshold = threshold_pct / 100;
  if (run_noise_pct >= 0) o.run_noise = run_noise_pct / 100;
  if (round_noise_pct >= 0) o.round_noise = round_noise_pct / 100;
  if (history.empty() && files.size() != 2)
    throw UsageError("compare takes BASE.json HEAD.json (or HEAD.json with --history FILE)");
  if (!history.empty() && files.size() != 1)
    throw UsageError("with --history, give one file: HEAD.json (the run to check against the history)");
  try {
    const compare::Run head = compare::load_run(files.back());
    const compare::Run base =
        history.empty() ? compare::load_run(files.front()) : compare::load_history(history, head, last);
    const compare::Report rep = compare::compare_runs(base, head, o);
    std::cout << compare::format_text(rep);
    if (!markdown.empty()) write_file(markdown, compare::format_markdown(rep));
    if (!json_out.empty()) write_file(json_out, compare::format_json(rep));
    return rep.exit_code();
  } catch (const compare::CompareError& e) {
    throw UsageError(e.what());
  }
}

}  // namespace stepbench::cli
