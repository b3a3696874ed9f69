// The step waits for the slowest tower: which one it is, how it compares with the others, and what
// it costs. From every tower's timeline of every timed step (forward, backward, when each gradient
// bucket was ready, when the sync let it go on), gathered on rank 0:
//   - per tower, the compute before the wait (forward + backward) and its wait;
//   - min, median and max over the towers; the slowest and the fastest by rank, host and GPU;
//   - each tower's relative score (the fastest's median compute over its own) and individual score
//     (its best step over its median), as NVIDIA's resiliency extension scores ranks;
//   - per repetition, whether the slowest tower was a straggler (its compute beyond the fastest's by
//     more than the noise): chronic when the same tower was in every repetition, occasional when
//     some tower was in some;
//   - the cost: the step minus the step with the slowest tower at the others' median compute. Its
//     bucket-ready times are replaced by the reference tower's (the other towers' median by compute)
//     and the buckets' syncs replayed one after another from when every tower had each bucket ready,
//     each taking as long as it took, so that slack in the overlap of sync and backward is counted.
//     Towers that run one after another (the cpu backend's, in one process) are shifted whole.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace stepbench {

// Where a tower ran.
struct TowerId {
  int tower = 0;   // global: rank * towers per process + local index
  int rank = 0;    // its process
  int device = 0;  // its GPU on the host (-1: the CPU)
  std::string host, bus_id, uuid;
  std::string state;  // the GPU's clocks, temperature, power and throttle reasons while it ran ("" none)
  int node = -1;      // its process's node where the processes span several (ProcessGroup::node); -1: one
};

// One tower in one timed step, in ms since the step's start on that tower's process.
struct TowerStep {
  double begin_ms = 0;                     // its forward started
  double forward_ms = 0, backward_ms = 0;  // its compute before the wait
  std::vector<double> ready_ms;            // bucket k ready (its gradients produced)
  std::vector<double> synced_ms;           // bucket k's sync ended
  double released_ms = 0;                  // the sync let it go on (the update may start)
  double compute() const { return forward_ms + backward_ms; }
};

struct StragglerInput {
  std::vector<TowerId> towers;  // global order
  // [repetition][step][tower]
  std::vector<std::vector<std::vector<TowerStep>>> steps;
  std::vector<std::vector<double>> step_ms;  // [repetition][step]: the step as timed (the slowest process)
  // per bucket: its collective's own duration; empty: bucket_sync_ms of the steps
  std::vector<double> sync_ms;
  bool sequential = false;  // a process's towers run one after another (cpu backend)
  int towers_per_process = 1;
};

struct TowerScore {
  int tower = 0;
  double median_ms = 0, best_ms = 0, wait_ms = 0;  // compute; wait: released - compute end, median
  double relative = 1, individual = 1;             // fastest median / own; own best / own median
  int slowest_in = 0;                              // repetitions in which it was the straggler
};

struct StragglerReport {
  bool valid = false;                            // at least two towers and one step
  std::vector<TowerScore> towers;                // global order
  int slowest = 0, fastest = 0;                  // tower indices
  double min_ms = 0, median_ms = 0, max_ms = 0;  // of the towers' median compute
  double noise = 0;                              // the towers' own step-to-step spread (relative, median over towers)
  double threshold = 0;                          // a straggler's compute exceeds the fastest's by this share
  int repetitions = 0, flagged = 0;              // repetitions, and those with a straggler
  std::string verdict;                           // "chronic", "occasional", "none"
  double step_ms = 0;                            // the measured step (median)
  double cost_ms = 0;                            // what the slowest tower costs the step (median over steps)
  double cost_share() const { return step_ms > 0 ? cost_ms / step_ms : 0; }
};

StragglerReport analyze_stragglers(const StragglerInput& in);
// Each bucket's collective on its own: in every step, the least any tower saw between the bucket
// being ready there (and the previous sync done) and its sync's end (the slowest tower waits for
// nobody), then the median over the steps.
std::vector<double> bucket_sync_ms(const StragglerInput& in);

// The summary's lines (top k slowest towers) and the --json section.
std::vector<std::string> straggler_lines(const StragglerInput& in, const StragglerReport& r, int top);
nlohmann::json straggler_json(const StragglerInput& in, const StragglerReport& r);

}  // namespace stepbench
