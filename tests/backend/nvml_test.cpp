// NVML (src/backend/cuda/nvml.*): the throttle-reason decoding on fixed bit patterns everywhere the
// cuda backend is built; the live queries where a driver and a GPU are present, skipped with the
// reason elsewhere.
#ifdef STEPBENCH_HAVE_CUDA
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <utility>

#include "backend/backend.hpp"
#include "backend/cuda/nvml.hpp"
#include "backend/registry.hpp"
#include "support/test_util.hpp"

namespace stepbench {
namespace {

using cuda::decode_throttle;

TEST(NvmlThrottle, NoBitsIsNotThrottled) {
  const DeviceState s = decode_throttle(0);
  EXPECT_FALSE(s.throttled);
  EXPECT_EQ(s.throttle_text, "");
  EXPECT_EQ(s.throttle_reasons, 0ULL);
}

TEST(NvmlThrottle, IdleIsNotThrottling) {
  const DeviceState s = decode_throttle(0x1);  // nvmlClocksThrottleReasonGpuIdle
  EXPECT_FALSE(s.throttled);
  EXPECT_EQ(s.throttle_text, "gpu_idle");
  EXPECT_EQ(s.throttle_reasons, 0x1ULL);
}

TEST(NvmlThrottle, SettingsAndSyncBoostAreNotThrottling) {
  // applications clocks, sync boost, display clocks
  const DeviceState s = decode_throttle(0x2 | 0x10 | 0x100);
  EXPECT_FALSE(s.throttled);
  EXPECT_EQ(s.throttle_text, "applications_clocks_setting, sync_boost, display_clock_setting");
}

TEST(NvmlThrottle, PowerCapIsThrottling) {
  const DeviceState s = decode_throttle(0x4);  // nvmlClocksThrottleReasonSwPowerCap
  EXPECT_TRUE(s.throttled);
  EXPECT_EQ(s.throttle_text, "sw_power_cap");
}

TEST(NvmlThrottle, EachSlowdownIsThrottling) {
  const std::pair<unsigned long long, const char*> slowdowns[] = {
      {0x8, "hw_slowdown"}, {0x20, "sw_thermal"}, {0x40, "hw_thermal"}, {0x80, "hw_power_brake"}};
  for (const auto& [bit, name] : slowdowns) {
    const DeviceState s = decode_throttle(bit);
    EXPECT_TRUE(s.throttled) << name;
    EXPECT_EQ(s.throttle_text, name);
  }
}

TEST(NvmlThrottle, SeveralBitsAreNamedInBitOrder) {
  const DeviceState s = decode_throttle(0x40 | 0x4 | 0x1);  // hw thermal, sw power cap, idle
  EXPECT_TRUE(s.throttled);
  EXPECT_EQ(s.throttle_text, "gpu_idle, sw_power_cap, hw_thermal");
  EXPECT_EQ(s.throttle_reasons, 0x45ULL);
  const DeviceState all = decode_throttle(0x1ff);
  EXPECT_TRUE(all.throttled);
  EXPECT_EQ(all.throttle_text,
            "gpu_idle, applications_clocks_setting, sw_power_cap, hw_slowdown, sync_boost, sw_thermal, hw_thermal, "
            "hw_power_brake, display_clock_setting");
}

TEST(NvmlThrottle, UnknownBitIsNamedButNotThrottling) {
  const DeviceState s = decode_throttle(0x200 | 0x1);
  EXPECT_FALSE(s.throttled);
  EXPECT_EQ(s.throttle_text, "gpu_idle, 0x200");
}

// Without a driver NVML is absent and every query answers nothing; with one, a bus id NVML does not
// know answers nothing either.
TEST(Nvml, AbsentOrUnknownDeviceAnswersNothing) {
  cuda::Nvml nvml;
  const bool available = nvml.available();
  EXPECT_EQ(nvml.available(), available);  // loaded once, the same answer after
  EXPECT_FALSE(nvml.state("not a bus id").has_value());
  EXPECT_FALSE(nvml.state("").has_value());
  const auto f = nvml.fingerprint("not a bus id");
  if (!available) {
    EXPECT_TRUE(f.empty());
  } else {
    for (const auto& [key, value] : f) EXPECT_EQ(key, "nvml_driver") << value;
  }
}

// The reader against a stand-in library (tests/backend/fake_nvml.c, built beside the tests): the
// entry points found by name (the throttle reasons under their pre-535 name), units converted,
// calls that fail left out, an unknown bus id answering nothing.
TEST(Nvml, ReadsAStandInLibrary) {
  cuda::Nvml nvml(STEPBENCH_FAKE_NVML);
  ASSERT_TRUE(nvml.available());
  const auto s = nvml.state("0000:3B:00.0");  // as cudaDeviceGetPCIBusId writes it
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->sm_clock_mhz, 1755);
  EXPECT_DOUBLE_EQ(s->mem_clock_mhz, 2619);
  EXPECT_DOUBLE_EQ(s->temperature_c, 47);
  EXPECT_DOUBLE_EQ(s->power_w, 312.456);
  EXPECT_EQ(s->throttle_reasons, 0x44ull);
  EXPECT_TRUE(s->throttled);
  EXPECT_EQ(s->throttle_text, "sw_power_cap, hw_thermal");
  EXPECT_FALSE(nvml.state("0000:3C:00.0").has_value());
  const auto f = nvml.fingerprint("0000:3B:00.0");
  EXPECT_EQ(f.at("nvml_driver"), "550.54.15");
  EXPECT_EQ(f.at("gpu_power_limit_w"), "700");
  EXPECT_EQ(f.at("gpu_max_sm_clock_mhz"), "1980");
  EXPECT_EQ(f.count("gpu_app_sm_clock_mhz"), 0u);  // not supported by this one
  EXPECT_FALSE(cuda::Nvml("/nonexistent/libnvidia-ml.so.1").available());
}

// The backend's device state: nothing on the cpu backend; on a GPU with NVML plausible clocks, a
// temperature and the fingerprint keys in versions().
TEST(Nvml, DeviceStateOfTheBackend) {
  EXPECT_FALSE(make_cpu_backend()->device_state().has_value());
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  cuda::Nvml nvml;
  if (!nvml.available()) GTEST_SKIP() << "NVML not available (libnvidia-ml.so.1 missing or nvmlInit failed)";
  auto be = make_backend(test::gpu_options());
  const auto versions = be->versions();
  ASSERT_TRUE(versions.count("gpu_count"));
  EXPECT_GE(std::stoi(versions.at("gpu_count")), 1);
  EXPECT_TRUE(versions.count("nvml_driver"));
  for (const auto& [k, v] : versions) std::cout << "  " << k << " = " << v << "\n";
  const auto s = be->device_state();
  ASSERT_TRUE(s.has_value()) << "NVML is available but does not know " << be->device_name() << " by its PCI bus id";
  EXPECT_GT(s->sm_clock_mhz, 0);
  EXPECT_LT(s->sm_clock_mhz, 5000);
  EXPECT_GT(s->mem_clock_mhz, 0);
  EXPECT_GT(s->temperature_c, 0);
  EXPECT_LT(s->temperature_c, 130);
  EXPECT_GE(s->power_w, 0);
  EXPECT_EQ(s->throttled, decode_throttle(s->throttle_reasons).throttled);
  std::cout << "  sm " << s->sm_clock_mhz << " MHz, mem " << s->mem_clock_mhz << " MHz, " << s->temperature_c << " C, "
            << s->power_w << " W, throttle: '" << s->throttle_text << "'\n";
}

}  // namespace
}  // namespace stepbench
#endif  // STEPBENCH_HAVE_CUDA
