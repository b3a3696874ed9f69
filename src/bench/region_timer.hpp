// Times a region of work on every tower: points are recorded as events on each tower's stream
// (device time) and read on a steady clock (host time). Point 0 is start(), the last is stop();
// mark() records the ones between. stop() waits for the work.
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "train/towers.hpp"

namespace stepbench {

class RegionTimer {
 public:
  RegionTimer(const Towers& t, int points);
  void start();
  void mark(int point);
  void stop();
  // The longest tower's device time between two points.
  double device_ms(int from, int to) const;
  // Host wall time from start() to the return of stop() (which waited for the device).
  double host_ms() const;

 private:
  const Towers& t_;
  std::vector<std::vector<std::unique_ptr<Event>>> ev_;  // [tower][point]
  std::chrono::steady_clock::time_point h0_, h1_;
};

}  // namespace stepbench
