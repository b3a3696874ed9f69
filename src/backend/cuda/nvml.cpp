// NVML through dlopen: the few entry points stepbench reads, declared here because nvml.h does not
// come with every CUDA toolkit (it is in the driver's development files), and resolved by name from
// libnvidia-ml.so.1 at run time. See nvml.hpp.
#include "backend/cuda/nvml.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

#include <array>
#include <utility>

#include "backend/cuda/dl.hpp"

namespace stepbench::cuda {

// NVML's opaque device handle, outside the anonymous namespace: Nvml::Api, a member of a class
// other files see, holds functions that take it (in a unity build GCC's -Wsubobject-linkage says so)
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;

namespace {

// ---- NVML's declarations -------------------------------------------------------------------------
// Values and signatures as in NVIDIA's public nvml.h: checked against the copy NVIDIA vendors in
// github.com/NVIDIA/go-nvml (pkg/nvml/nvml.h, NVML_API_VERSION 13, commit 2f9e261f), and older copies
// of the header in public code give the same values. nvml.h maps nvmlInit, nvmlDeviceGetCount and
// nvmlDeviceGetHandleByPciBusId to their _v2 symbols, which are looked up here by those names.
using nvmlReturn_t = int;                     // enum nvmlReturn_enum
constexpr nvmlReturn_t kNvmlSuccess = 0;      // NVML_SUCCESS
constexpr int kClockSm = 1;                   // nvmlClockType_t NVML_CLOCK_SM (NVML_CLOCK_GRAPHICS is 0)
constexpr int kClockMem = 2;                  // NVML_CLOCK_MEM
constexpr int kTemperatureGpu = 0;            // nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU
constexpr unsigned kDriverVersionChars = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

// nvmlClocksThrottleReason* (nvmlClocksEventReason* since NVML 12, same bits), in bit order.
struct ReasonBit {
  unsigned long long bit;
  const char* name;
  bool throttles;  // holds the clocks below what the GPU would run at for this work
};
constexpr std::array<ReasonBit, 9> kReasons{{
    {0x0000000000000001ULL, "gpu_idle", false},                     // ...GpuIdle
    {0x0000000000000002ULL, "applications_clocks_setting", false},  // ...ApplicationsClocksSetting
    {0x0000000000000004ULL, "sw_power_cap", true},                  // ...SwPowerCap
    {0x0000000000000008ULL, "hw_slowdown", true},                   // ...HwSlowdown
    {0x0000000000000010ULL, "sync_boost", false},                   // ...SyncBoost
    {0x0000000000000020ULL, "sw_thermal", true},                    // ...SwThermalSlowdown
    {0x0000000000000040ULL, "hw_thermal", true},                    // ...HwThermalSlowdown
    {0x0000000000000080ULL, "hw_power_brake", true},                // ...HwPowerBrakeSlowdown
    {0x0000000000000100ULL, "display_clock_setting", false},        // ...DisplayClockSetting
}};

// f(args...) == NVML_SUCCESS, false where the library lacks the entry point.
template <class F, class... A>
bool ok(F f, A... args) {
  return f != nullptr && f(args...) == kNvmlSuccess;
}

}  // namespace

DeviceState decode_throttle(unsigned long long reasons) {
  DeviceState s;
  s.throttle_reasons = reasons;
  unsigned long long known = 0;
  for (const ReasonBit& r : kReasons) {
    known |= r.bit;
    if ((reasons & r.bit) == 0) continue;
    if (!s.throttle_text.empty()) s.throttle_text += ", ";
    s.throttle_text += r.name;
    s.throttled = s.throttled || r.throttles;
  }
  for (int b = 0; b < 64; ++b) {  // a reason newer than this table: named by its bit, not counted
    const unsigned long long bit = 1ULL << b;
    if ((reasons & bit) == 0 || (known & bit) != 0) continue;
    if (!s.throttle_text.empty()) s.throttle_text += ", ";
    s.throttle_text += fmt::format("0x{:x}", bit);
  }
  return s;
}

struct Nvml::Api {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*driver_version)(char*, unsigned) = nullptr;
  nvmlReturn_t (*device_count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle_by_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*max_clock)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*app_clock)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*power_mw)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*power_limit_mw)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*throttle_reasons)(nvmlDevice_t, unsigned long long*) = nullptr;

  nvmlDevice_t device(const std::string& pci_bus_id) const {
    nvmlDevice_t d = nullptr;
    if (pci_bus_id.empty() || !ok(handle_by_bus_id, pci_bus_id.c_str(), &d)) return nullptr;
    return d;
  }
};

Nvml::Nvml(std::string library) : library_(std::move(library)) {}

Nvml::~Nvml() {
  if (!api_) return;
  api_->shutdown();
  dlclose(api_->lib);
}

Nvml::Api* Nvml::load() {
  const std::lock_guard<std::mutex> lock(mu_);
  if (tried_) return api_.get();
  tried_ = true;
  void* lib = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return nullptr;  // no NVIDIA driver here
  auto a = std::make_unique<Api>();
  a->lib = lib;
  resolve(lib, "nvmlInit_v2", a->init);
  resolve(lib, "nvmlShutdown", a->shutdown);
  resolve(lib, "nvmlSystemGetDriverVersion", a->driver_version);
  resolve(lib, "nvmlDeviceGetCount_v2", a->device_count);
  resolve(lib, "nvmlDeviceGetHandleByPciBusId_v2", a->handle_by_bus_id);
  resolve(lib, "nvmlDeviceGetClockInfo", a->clock);
  resolve(lib, "nvmlDeviceGetMaxClockInfo", a->max_clock);
  resolve(lib, "nvmlDeviceGetApplicationsClock", a->app_clock);
  resolve(lib, "nvmlDeviceGetTemperature", a->temperature);
  resolve(lib, "nvmlDeviceGetPowerUsage", a->power_mw);
  resolve(lib, "nvmlDeviceGetEnforcedPowerLimit", a->power_limit_mw);
  // The name since NVML 12 (driver 535); the older one, deprecated in NVML 13, before that.
  resolve(lib, "nvmlDeviceGetCurrentClocksEventReasons", a->throttle_reasons);
  if (a->throttle_reasons == nullptr) resolve(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", a->throttle_reasons);
  if (a->shutdown == nullptr || a->handle_by_bus_id == nullptr || !ok(a->init)) {
    dlclose(lib);
    return nullptr;
  }
  unsigned n = 0;
  if (!ok(a->device_count, &n) || n == 0) {
    a->shutdown();
    dlclose(lib);
    return nullptr;
  }
  api_ = std::move(a);
  return api_.get();
}

bool Nvml::available() { return load() != nullptr; }

std::optional<DeviceState> Nvml::state(const std::string& pci_bus_id) {
  const Api* a = load();
  const nvmlDevice_t d = a != nullptr ? a->device(pci_bus_id) : nullptr;
  if (d == nullptr) return std::nullopt;
  unsigned long long reasons = 0;
  if (!ok(a->throttle_reasons, d, &reasons)) reasons = 0;
  DeviceState s = decode_throttle(reasons);
  unsigned v = 0;
  if (ok(a->clock, d, kClockSm, &v)) s.sm_clock_mhz = v;
  if (ok(a->clock, d, kClockMem, &v)) s.mem_clock_mhz = v;
  if (ok(a->temperature, d, kTemperatureGpu, &v)) s.temperature_c = v;
  if (ok(a->power_mw, d, &v)) s.power_w = v / 1000.0;
  return s;
}

std::map<std::string, std::string> Nvml::fingerprint(const std::string& pci_bus_id) {
  std::map<std::string, std::string> f;
  const Api* a = load();
  if (a == nullptr) return f;
  std::array<char, kDriverVersionChars> driver{};
  if (ok(a->driver_version, driver.data(), kDriverVersionChars)) {
    driver.back() = '\0';
    f["nvml_driver"] = driver.data();
  }
  const nvmlDevice_t d = a->device(pci_bus_id);
  if (d == nullptr) return f;
  unsigned v = 0;
  if (ok(a->power_limit_mw, d, &v)) f["gpu_power_limit_w"] = fmt::format("{:g}", v / 1000.0);
  if (ok(a->max_clock, d, kClockSm, &v)) f["gpu_max_sm_clock_mhz"] = std::to_string(v);
  if (ok(a->app_clock, d, kClockSm, &v)) f["gpu_app_sm_clock_mhz"] = std::to_string(v);
  if (ok(a->app_clock, d, kClockMem, &v)) f["gpu_app_mem_clock_mhz"] = std::to_string(v);
  return f;
}

}  // namespace stepbench::cuda
