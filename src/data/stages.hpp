// The input pipeline's stages and their times. Image stages are wall time on each of the
// pipeline's worker threads (a preempted thread's wait counts too), summed over the threads; `assembly` is a worker's
// time per batch outside its images (taking a buffer, the labels, handing the batch over); `copy` is the host-to-device
// staging on the step's side; `idle` is the workers' time waiting for room (the step is slower than they are).
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <vector>

namespace stepbench {

enum class Stage : int { read, decode, resize, crop, flip_normalise, assembly, copy };
inline constexpr int kStages = 7;
constexpr std::array<std::string_view, kStages> kStageNames = {"read",           "decode",   "resize", "crop",
                                                               "flip_normalise", "assembly", "copy"};

struct StageTimes {
  std::array<double, kStages> seconds{};
  double idle = 0;
  double open = 0;  // in a stage not yet ended at the snapshot (charged to it at its end)
  std::uint64_t images = 0, batches = 0;
  double& operator[](Stage s) { return seconds[static_cast<std::size_t>(s)]; }
  double operator[](Stage s) const { return seconds[static_cast<std::size_t>(s)]; }
  double busy() const {  // every stage but the copy (which runs on the step's side)
    double t = 0;
    for (int i = 0; i < kStages; ++i)
      if (i != static_cast<int>(Stage::copy)) t += seconds[static_cast<std::size_t>(i)];
    return t;
  }
  StageTimes operator-(const StageTimes& b) const {
    StageTimes d = *this;
    for (std::size_t i = 0; i < seconds.size(); ++i) d.seconds[i] -= b.seconds[i];
    d.idle -= b.idle;
    d.open -= b.open;
    d.images -= b.images;
    d.batches -= b.batches;
    return d;
  }
  StageTimes& operator+=(const StageTimes& b) {
    for (std::size_t i = 0; i < seconds.size(); ++i) seconds[i] += b.seconds[i];
    idle += b.idle;
    open += b.open;
    images += b.images;
    batches += b.batches;
    return *this;
  }
};

// One stage of one worker thread (or its wait for room), on the steady clock (ns since its epoch):
// what a thread did, kept while tracing is on (--trace's input pipeline tracks).
struct StageSpan {
  static constexpr int kIdle = -1;
  int stage;  // a Stage, or kIdle
  std::uint64_t t0, t1;
};

// One thread's clock. Every moment since its construction belongs to exactly one of: a stage
// (lap(s) charges the time since the last lap, or since the last wait, to s), a wait for room
// (begin_idle/end_idle), or the stage in progress, which a snapshot counts as `open`. So between
// two snapshots stages + open + idle is the thread's elapsed time, whatever it was doing at either.
// A mutex (uncontended but for snapshots) keeps the snapshot consistent.
class StageCounters {
 public:
  StageCounters() : last_(now()) {}
  void lap(Stage s) {
    const auto t = now();
    std::lock_guard<std::mutex> l(mu_);
    ns_[static_cast<std::size_t>(s)] += t - last_;
    if (tracing_) spans_.push_back({static_cast<int>(s), std::max(last_, since_), t});
    last_ = t;
  }
  void begin_idle() {  // what led up to the wait is the batch's bookkeeping
    const auto t = now();
    std::lock_guard<std::mutex> l(mu_);
    ns_[static_cast<std::size_t>(Stage::assembly)] += t - last_;
    if (tracing_) spans_.push_back({static_cast<int>(Stage::assembly), std::max(last_, since_), t});
    last_ = t;
    waiting_ = true;
  }
  void end_idle() {
    const auto t = now();
    std::lock_guard<std::mutex> l(mu_);
    idle_ns_ += t - last_;
    if (tracing_) spans_.push_back({StageSpan::kIdle, std::max(last_, since_), t});
    last_ = t;
    waiting_ = false;
  }
  // Keep every stage's span from now on (or stop), and hand over those kept so far.
  void trace(bool on) {
    const auto t = now();
    std::lock_guard<std::mutex> l(mu_);
    tracing_ = on;
    since_ = t;  // a span in progress is kept from here
    spans_.clear();
  }
  std::vector<StageSpan> take_spans() {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<StageSpan> v;
    v.swap(spans_);
    return v;
  }
  void count_image() {
    std::lock_guard<std::mutex> l(mu_);
    ++images_;
  }
  void count_batch() {
    std::lock_guard<std::mutex> l(mu_);
    ++batches_;
  }
  // Adds this thread's totals up to now.
  void add_to(StageTimes& st) const {
    const auto t = now();
    std::lock_guard<std::mutex> l(mu_);
    for (std::size_t i = 0; i < ns_.size(); ++i) st.seconds[i] += static_cast<double>(ns_[i]) * 1e-9;
    st.idle += static_cast<double>(idle_ns_ + (waiting_ ? t - last_ : 0)) * 1e-9;
    st.open += static_cast<double>(waiting_ ? 0 : t - last_) * 1e-9;
    st.images += images_;
    st.batches += batches_;
  }

 private:
  static std::uint64_t now() {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  mutable std::mutex mu_;
  std::array<std::uint64_t, kStages> ns_{};
  std::uint64_t idle_ns_ = 0, last_ = 0, images_ = 0, batches_ = 0;
  bool waiting_ = false;
  bool tracing_ = false;
  std::uint64_t since_ = 0;
  std::vector<StageSpan> spans_;
};

}  // namespace stepbench
