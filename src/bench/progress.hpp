// The live progress line (hyperfine's): what runs now, the repetition, the time since the start,
// redrawn in place on stderr while the run lasts, and only when stderr is a terminal: logs, pipes
// and CI output get none of it. Thread-safe: the fixtures set it, a thread of its own redraws it
// every fifth of a second, so the elapsed time moves during a long repetition too.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace stepbench {

class Progress {
 public:
  // on: draw at all (the root process, and BenchConfig::progress: the command line found stderr a
  // terminal).
  explicit Progress(bool on, std::FILE* out = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // What runs now, e.g. "warm-up 1/2" or "[2/5] forward"; shown until the next call or clear().
  void set(std::string what);
  // How many benchmarks will run, for "[k/N]" (0: unknown).
  void set_total(int n);
  // A fixture's call with this iteration count: Google Benchmark calls a benchmark with growing
  // counts until its first repetition is long enough, then once per repetition with the same count.
  void repetition(const std::string& what, long long iterations, int repetitions);
  // Erases the line (before other output) until the next set().
  void clear();
  bool on() const { return on_; }

 private:
  void draw_locked();
  void loop();

  bool on_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_;
  std::mutex m_;
  std::condition_variable cv_;
  std::string what_;
  bool shown_ = false, done_ = false;
  std::string last_name_;
  long long last_iterations_ = -1;
  int rep_ = 0;
  int index_ = 0, total_ = 0;
  std::thread thread_;
};

}  // namespace stepbench
