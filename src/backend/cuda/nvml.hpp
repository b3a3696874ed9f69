// NVML, the driver's management library, read for the GPU's state (clocks, temperature, power, why
// the clocks are held down) and for a fingerprint of its settings (driver, power limit, clocks).
// libnvidia-ml.so.1 comes with the NVIDIA driver, not with the CUDA toolkit, so it is loaded at run
// time (dlopen) on first use and nothing links against it: where it is absent (no driver), or
// nvmlInit fails, every query quietly answers nothing. Internal to src/backend/cuda (and its tests).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backend/backend.hpp"

namespace stepbench::cuda {

// A DeviceState holding only the throttle fields decoded from NVML's clocks-throttle-reason bits:
// throttle_reasons = reasons; throttle_text names the bits that are set in bit order ("gpu_idle",
// "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal",
// "hw_thermal", "hw_power_brake", "display_clock_setting", an unknown bit as its hex value), joined
// by ", "; throttled is set by sw_power_cap, hw_slowdown, sw_thermal, hw_thermal and hw_power_brake
// only (an idle GPU, application clocks, sync boost and display clocks are not throttling).
DeviceState decode_throttle(unsigned long long reasons);

// One NVML session: loaded and initialised on the first call, shut down and unloaded by the
// destructor (nvmlInit and dlopen count references, so several may live in one process). The
// calls may come from several threads. GPUs are named by their PCI bus id as
// cudaDeviceGetPCIBusId writes it ("0000:3B:00.0").
class Nvml {
 public:
  // `library`: the driver's libnvidia-ml.so.1 (tests load a stand-in by its path)
  explicit Nvml(std::string library = "libnvidia-ml.so.1");
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // NVML loaded, initialised, and seeing at least one GPU.
  bool available();
  // Clocks, temperature, power and throttle reasons of that GPU now (a value NVML does not give
  // stays 0); nullopt when NVML is not available or does not know the bus id.
  std::optional<DeviceState> state(const std::string& pci_bus_id);
  // "nvml_driver" (e.g. "550.54.15"), "gpu_power_limit_w", "gpu_max_sm_clock_mhz",
  // "gpu_app_sm_clock_mhz", "gpu_app_mem_clock_mhz": each that NVML answers; empty when not available.
  std::map<std::string, std::string> fingerprint(const std::string& pci_bus_id);

 private:
  struct Api;   // the library handle and its entry points (nvml.cpp)
  Api* load();  // the loaded API, or nullptr; tries once
  std::string library_;
  std::mutex mu_;
  bool tried_ = false;
  std::unique_ptr<Api> api_;
};

}  // namespace stepbench::cuda
