// CUPTI's activity API for the cuda backend's device activity records (Backend::start_activity and
// the rest): every kernel, copy and set with its device start and end, tagged through CUPTI's
// external correlation ids (the innermost tag the launching thread pushed). libcupti is loaded at
// run time (dlopen), so a machine without it runs everything else and --trace says why it has no
// kernel names. CUPTI is one per process: the backends of several GPUs share it (start and stop
// count references), and each takes its own device's records. Internal to src/backend/cuda.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace stepbench::cuda {

// "" when CUPTI can be loaded here, else why not. Never throws.
std::string cupti_unavailable();
// The first start loads CUPTI and turns on its kernel, copy, set, API and external-correlation
// records; UnsupportedError naming CUPTI's error (another profiler attached, say) when it cannot.
void cupti_start();
void cupti_stop();  // the last stop turns the records off
void cupti_push(std::uint64_t tag);
void cupti_pop();
std::uint64_t cupti_now_ns();  // CUPTI's clock, which the records' times are on; 0 before a start
// Flushes CUPTI's buffers and returns device `device`'s records since the last take, in start order,
// each with its tag resolved (0 where the launch had none).
std::vector<DeviceActivity> cupti_take(int device);

// C++ names demangled ("void f<float>(int)"); other names as they are.
std::string demangle(const char* name);

}  // namespace stepbench::cuda
