// A stand-in for the driver's libnvidia-ml.so.1 with one GPU at bus id 0000:3B:00.0, for
// tests/backend/nvml_test.cpp: what stepbench's NVML reader looks up by name, returning fixed
// values (SM 1755 MHz, memory 2619 MHz, 47 C, 312.456 W, power limit 700 W, max SM clock 1980
// MHz, no application clocks, throttle reasons 0x44 = sw_power_cap | hw_thermal). It exports only
// the old name of the throttle-reason call, as drivers before 535 do. Return codes as nvml.h:
// 0 success, 2 invalid argument, 3 not supported, 6 not found.
#include <cstdio>
#include <cstring>

extern "C" {

typedef struct nvmlDevice_st* nvmlDevice_t;
static struct nvmlDevice_st { int unused; } dev;

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char* v, unsigned n) {
  std::strncpy(v, "550.54.15", n);
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned* n) {
  *n = 1;
  return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* id, nvmlDevice_t* d) {
  // domain:bus:device.function in hex, the domain 4 digits (cudaDeviceGetPCIBusId) or 8 (NVML)
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  if (std::sscanf(id, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4 || domain != 0 || bus != 0x3b ||
      device != 0 || function != 0)
    return 6;
  *d = &dev;
  return 0;
}
int nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned* c) {
  *c = type == 1 ? 1755 : type == 2 ? 2619 : 0;
  return type == 1 || type == 2 ? 0 : 2;
}
int nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned* c) {
  *c = 1980;
  return type == 1 ? 0 : 2;
}
int nvmlDeviceGetApplicationsClock(nvmlDevice_t d, int type, unsigned* c) { return 3; }
int nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned* t) {
  *t = 47;
  return sensor == 0 ? 0 : 2;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned* p) {
  *p = 312456;
  return 0;
}
int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned* p) {
  *p = 700000;
  return 0;
}
int nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long* r) {
  *r = 0x44;
  return 0;
}

}  // extern "C"
