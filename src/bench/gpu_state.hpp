// The GPUs' state around a timed repetition (Backend::device_state: NVML's clocks, temperature,
// power and throttle reasons), as counters in every repetition's JSON entry: "throttled" (1 when a
// power cap or a thermal or hardware slowdown held any tower's clocks down at the start or the
// end), the lowest SM clock, the highest temperature and power. Nothing on the CPU.
#pragma once
#include <benchmark/benchmark.h>

#include <algorithm>
#include <optional>

#include "train/towers.hpp"

namespace stepbench {

class GpuStateProbe {
 public:
  void read(const Towers& t) {
    for (int i = 0; i < t.size(); ++i) read(t.backend(i));
  }
  void read(const Backend& be) {
    const auto s = be.device_state();
    if (!s) return;
    seen_ = true;
    throttled_ = throttled_ || s->throttled;
    sm_clock_ = sm_clock_ > 0 ? std::min(sm_clock_, s->sm_clock_mhz) : s->sm_clock_mhz;
    temperature_ = std::max(temperature_, s->temperature_c);
    power_ = std::max(power_, s->power_w);
  }
  void report(benchmark::State& st) const {
    if (!seen_) return;
    st.counters["throttled"] = throttled_ ? 1 : 0;
    st.counters["sm_clock_mhz"] = sm_clock_;
    st.counters["temperature_c"] = temperature_;
    st.counters["power_w"] = power_;
  }

 private:
  bool seen_ = false, throttled_ = false;
  double sm_clock_ = 0, temperature_ = 0, power_ = 0;
};

}  // namespace stepbench
