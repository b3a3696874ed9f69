#include "bench/region_timer.hpp"

#include <algorithm>

#include "tensor/error.hpp"

namespace stepbench {

RegionTimer::RegionTimer(const Towers& t, int points) : t_(t) {
  SB_CHECK(points >= 2, "a region has a start and a stop");
  ev_.resize(static_cast<std::size_t>(t.size()));
  for (int i = 0; i < t.size(); ++i)
    for (int p = 0; p < points; ++p) ev_[static_cast<std::size_t>(i)].push_back(t.backend(i).create_event());
}
void RegionTimer::start() {
  h0_ = std::chrono::steady_clock::now();
  mark(0);
}
void RegionTimer::mark(int point) {
  for (int i = 0; i < t_.size(); ++i)
    t_.backend(i).record(*ev_[static_cast<std::size_t>(i)].at(static_cast<std::size_t>(point)), t_.stream(i));
}
void RegionTimer::stop() {
  mark(static_cast<int>(ev_[0].size()) - 1);
  t_.synchronize();
  h1_ = std::chrono::steady_clock::now();
}
double RegionTimer::device_ms(int from, int to) const {
  double ms = 0;
  for (int i = 0; i < t_.size(); ++i) {
    auto& ev = ev_[static_cast<std::size_t>(i)];
    ms = std::max(
        ms, t_.backend(i).elapsed_ms(*ev.at(static_cast<std::size_t>(from)), *ev.at(static_cast<std::size_t>(to))));
  }
  return ms;
}
double RegionTimer::host_ms() const { return std::chrono::duration<double, std::milli>(h1_ - h0_).count(); }

}  // namespace stepbench
