// A run cut short by SIGINT or SIGTERM, halted because its numbers stopped being finite, or ended by
// a failed sync (a peer gone or silent: the group is spent). The command line's handler stores the
// signal in an atomic (BenchConfig::interrupt); the benchmarks poll it, so that the phases already
// measured are reported and written to --json whole, and the rest are marked "cut short" (or "not
// run") instead of being run. Under mpirun the processes agree (a max over the group) before each
// benchmark, so that all of them stop at the same one and no collective is left waiting; once the
// group is spent nothing asks it again.
#pragma once
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <string>
#include <utility>

#include "comm/process_group.hpp"

namespace stepbench {

class Interrupt {
 public:
  Interrupt(const std::atomic<int>* flag, const ProcessGroup& group) : flag_(flag), group_(group) {}
  // The signal this process received (0: none), without asking the others.
  int local() const { return flag_ ? flag_->load() : 0; }
  // The signal any process received (0: none); a collective: every process calls it at the same point.
  int agreed() const {
    if (spent_) return kHalted;  // the group cannot answer: its collectives fail or wait
    const int mine = local() ? local() : halted_.empty() ? 0 : kHalted;
    const int s = group_.size() > 1 ? static_cast<int>(group_.allreduce_max(mine)) : mine;
    if (s == kHalted && halted_.empty()) halted_ = "another process's numbers stopped being finite";
    if (s && s != kHalted) signal_ = s;
    return s;
  }
  // The run cannot go on (why: e.g. where the first non-finite number is); the benchmarks after this
  // one are marked not run.
  void halt(std::string why) const { halted_ = std::move(why); }
  const std::string& halted() const { return halted_; }
  // A sync failed (SyncError: a peer ended, stalled or went silent): halted, and the group spent, so
  // that no benchmark or report after this one calls a collective; the run then ends with exit 1.
  void spend(std::string why) const {
    halted_ = std::move(why);
    spent_ = true;
  }
  bool spent() const { return spent_; }
  // spend(why) from inside a benchmark, which is marked as failed. A loop not yet begun (the sync
  // failed before it: agreed()'s, say) begins and runs nothing, so that this repetition counts the
  // iterations the others ran: Google Benchmark 1.7 aborts when the repetitions' counts differ.
  void fail(benchmark::State& st, std::string why) const {
    if (!st.error_occurred()) st.SkipWithError(fmt::format("the sync failed: {}", why).c_str());
    if (st.iterations() == 0)  // not begun (once begun, a failed state counts every iteration)
      for (auto _ : st) {
      }
    spend(std::move(why));
  }
  // At a benchmark's start (every process): true, and the benchmark marked as not measured, once
  // a signal came.
  bool skip(benchmark::State& st) const {
    if (!agreed()) return false;
    // inside the loop, so that the repetition counts the iterations the others ran (Google
    // Benchmark 1.7 checks that every repetition of a benchmark has the same count)
    for (auto _ : st) {
      st.SkipWithError(message().c_str());
      break;
    }
    return true;
  }
  // Inside a timed loop (one process only: no collective between iterations to agree on).
  bool stop_in_loop(benchmark::State& st) const {
    if (group_.size() > 1 || !local()) return false;
    signal_ = local();
    st.SkipWithError(message().c_str());
    return true;
  }
  int signal() const { return signal_; }
  std::string name() const {
    return signal_ == SIGINT ? "SIGINT" : signal_ == SIGTERM ? "SIGTERM" : fmt::format("signal {}", signal_);
  }
  std::string message() const {
    return signal_ ? fmt::format("cut short by {}: not measured", name()) : "not run: " + halted_;
  }

 private:
  static constexpr int kHalted = 1000;  // above every signal number
  const std::atomic<int>* flag_;
  const ProcessGroup& group_;
  mutable int signal_ = 0;
  mutable std::string halted_;
  mutable bool spent_ = false;
};

}  // namespace stepbench
