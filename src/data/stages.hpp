// The input pipeline's stages and their times. Image stages are thread time on the pipeline's
// workers, summed over the threads; `assembly` is a worker's time per batch outside its images
// (taking a buffer, the labels, handing the batch over); `copy` is the host-to-device staging on
// the step's side; `idle` is the workers' time waiting for room (the step is slower than they are).
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace stepbench {

enum class Stage : int { read, decode, resize, crop, flip_normalise, assembly, copy };
inline constexpr int kStages = 7;
constexpr std::array<std::string_view, kStages> kStageNames = {"read",           "decode",   "resize", "crop",
                                                               "flip_normalise", "assembly", "copy"};

struct StageTimes {
  std::array<double, kStages> seconds{};
  double idle = 0;
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
    d.images -= b.images;
    d.batches -= b.batches;
    return d;
  }
  StageTimes& operator+=(const StageTimes& b) {
    for (std::size_t i = 0; i < seconds.size(); ++i) seconds[i] += b.seconds[i];
    idle += b.idle;
    images += b.images;
    batches += b.batches;
    return *this;
  }
};

// One thread's running totals, in nanoseconds (read by other threads while it runs).
struct StageCounters {
  std::array<std::atomic<std::uint64_t>, kStages> ns{};
  std::atomic<std::uint64_t> idle_ns{0}, images{0}, batches{0};
  // while the thread waits: when it began (steady clock, ns), so a snapshot counts a wait in progress
  std::atomic<std::int64_t> idle_since{-1};
  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void begin_idle() { idle_since.store(now_ns()); }
  void end_idle() {
    const std::int64_t since = idle_since.exchange(-1);
    if (since >= 0) idle_ns.fetch_add(static_cast<std::uint64_t>(now_ns() - since));
  }
  void add_to(StageTimes& t) const {
    for (std::size_t i = 0; i < ns.size(); ++i) t.seconds[i] += static_cast<double>(ns[i].load()) * 1e-9;
    const std::int64_t since = idle_since.load();
    t.idle +=
        static_cast<double>(idle_ns.load() + (since >= 0 ? static_cast<std::uint64_t>(now_ns() - since) : 0)) * 1e-9;
    t.images += images.load();
    t.batches += batches.load();
  }
};

// Times consecutive stages on one thread: lap(s) charges the time since the last lap to s.
class StageClock {
 public:
  explicit StageClock(StageCounters* c) : c_(c), t_(std::chrono::steady_clock::now()) {}
  void lap(Stage s) {
    const auto now = std::chrono::steady_clock::now();
    if (c_)
      c_->ns[static_cast<std::size_t>(s)].fetch_add(
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - t_).count()),
          std::memory_order_relaxed);
    t_ = now;
  }
  void reset() { t_ = std::chrono::steady_clock::now(); }

 private:
  StageCounters* c_;
  std::chrono::steady_clock::time_point t_;
};

}  // namespace stepbench
