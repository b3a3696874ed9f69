// The benchmark run, stage by stage (stages.hpp says what each stage takes and gives, and where it is).
#include "bench/bench.hpp"

#include "bench/stages.hpp"

namespace stepbench {
namespace {

// After a failed sync the group is spent: its connections closed, so that every other process fails
// at once rather than at its own timeout (under MPI, MPI_Abort ends them with this code).
int end_spent(const Run& run, int code) {
  if (run.stop.spent()) run.group.abort(code);
  return code;
}

}  // namespace

int run_benchmarks(const BenchConfig& c, const ProcessGroup& group, const char* argv0,
                   const std::vector<std::string>& peer_dirs) {
  Run run(c, group, peer_dirs);
  if (Exit e = set_up(run, argv0)) return *e;  // fail-fast checks, the towers, the feeder (--list ends here)
  if (Exit e = warm_up(run)) return *e;        // untimed steps; the non-finite check
  calibrate_slow_tower(run);                   // --slow-tower
  const Timings t = time_phases(run);          // the Google Benchmark fixtures, one per phase
  if (t.exit) return *t.exit;
  const Probes p = probe(run, t, measure_peak(run, t));                 // the peak; --layer-times, --trace, ...
  if (!run.root) return end_spent(run, other_process_exit(run, t, p));  // one report, from process 0
  if (Exit e = report_cut_short(run, t, p)) return end_spent(run, *e);  // a signal, a blow-up, a failed sync
  keep_run(run, t);                                      // --history, the plan cache, --suggest, input stages
  const PeerResult peer = compare_with_peer(run, t, p);  // PyTorch in the same run
  return report(run, t, p, peer);                        // the summary and the sections asked for
}

}  // namespace stepbench
