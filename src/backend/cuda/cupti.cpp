// CUPTI through dlopen (cupti.hpp): cupti.h gives the types, the record layouts and the functions'
// signatures; the functions themselves are looked up by name in libcupti.so.13 at the first start.
// Records arrive in buffers CUPTI asks for and hands back (possibly on its own thread): the
// completion callback copies what stepbench needs out of them under a mutex.
#include "backend/cuda/cupti.hpp"

#include <cxxabi.h>
#include <dlfcn.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backend/cuda/dl.hpp"
#include "tensor/error.hpp"

#if __has_include(<cupti.h>)
#include <cupti.h>
#define STEPBENCH_HAVE_CUPTI 1
#endif

namespace stepbench::cuda {

std::string demangle(const char* name) {
  if (name == nullptr) return "(unnamed)";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

#ifndef STEPBENCH_HAVE_CUPTI
std::string cupti_unavailable() { return "stepbench was built without CUPTI's headers (cupti.h)"; }
void cupti_start() { throw UnsupportedError(cupti_unavailable()); }
void cupti_stop() {}
void cupti_push(std::uint64_t) {}
void cupti_pop() {}
std::uint64_t cupti_now_ns() { return 0; }
std::vector<DeviceActivity> cupti_take(int) { return {}; }
#else
namespace {

constexpr std::size_t kBufferBytes = 8 << 20;
constexpr CUpti_ExternalCorrelationKind kTagKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};

struct Record {
  DeviceActivity a;
  int device;
  std::uint32_t correlation;
};

struct Api {
  void* lib = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityPushExternalCorrelationId) push = nullptr;
  decltype(&cuptiActivityPopExternalCorrelationId) pop = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

// Two locks: `ctl` around loading, starting and stopping (CUPTI calls that may deliver buffers or wait
// for CUPTI's own thread), `rec` around the records alone, which buffer_completed takes: no CUPTI
// call is made while `rec` is held.
struct State {
  std::mutex ctl;
  bool tried = false;
  std::string why;  // why CUPTI is not available ("" once loaded)
  Api api;
  int users = 0;
  bool callbacks = false;
  std::mutex rec;
  std::vector<Record> records;
  std::unordered_map<std::uint32_t, std::uint64_t> tags;  // API call's correlation id -> tag
};
State& state() {
  static State& s = *new State;  // never destroyed: CUPTI may hand a buffer back during the process's exit
  return s;
}

std::string err(const Api& a, CUptiResult r) {
  const char* s = nullptr;
  if (a.result_string != nullptr && a.result_string(r, &s) == CUPTI_SUCCESS && s != nullptr)
    return fmt::format("{} ({})", s, static_cast<int>(r));
  return fmt::format("CUPTI error {}", static_cast<int>(r));
}

// Loads the library once; state().why says why not. Called with the mutex held.
void load(State& s) {
  if (s.tried) return;
  s.tried = true;
  void* lib = nullptr;
  for (const char* name : {"libcupti.so.13", "libcupti.so"})
    if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  if (lib == nullptr) {
    s.why =
        "libcupti.so.13 (CUDA's CUPTI) was not found: put the CUDA toolkit's lib64 or the nvidia-cuda-cupti "
        "wheel's lib on LD_LIBRARY_PATH for kernel names";
    return;
  }
  Api& a = s.api;
  a.lib = lib;
  resolve(lib, "cuptiActivityRegisterCallbacks", a.register_callbacks);
  resolve(lib, "cuptiActivityEnable", a.enable);
  resolve(lib, "cuptiActivityDisable", a.disable);
  resolve(lib, "cuptiActivityFlushAll", a.flush_all);
  resolve(lib, "cuptiActivityGetNextRecord", a.next_record);
  resolve(lib, "cuptiActivityPushExternalCorrelationId", a.push);
  resolve(lib, "cuptiActivityPopExternalCorrelationId", a.pop);
  resolve(lib, "cuptiGetTimestamp", a.timestamp);
  resolve(lib, "cuptiGetResultString", a.result_string);
  if (!a.register_callbacks || !a.enable || !a.disable || !a.flush_all || !a.next_record || !a.push || !a.pop ||
      !a.timestamp) {
    s.why = "the libcupti found lacks the activity API's entry points";
    dlclose(lib);
    a = Api{};
  }
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  // CUPTI wants 8-byte aligned buffers
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  State& s = state();
  {
    const std::lock_guard<std::mutex> lock(s.rec);
    CUpti_Activity* r = nullptr;
    while (s.api.next_record != nullptr && s.api.next_record(buffer, valid, &r) == CUPTI_SUCCESS) {
      switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
          if (k->start == 0 || k->end < k->start) break;  // no times collected
          s.records.push_back(
              {{demangle(k->name), k->start, k->end, 0, k->streamId}, static_cast<int>(k->deviceId), k->correlationId});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
          if (m->start == 0 || m->end < m->start) break;
          const char* kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                             : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                             : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "DtoD"
                                                                              : "other";
          s.records.push_back({{fmt::format("memcpy {} ({} bytes)", kind, m->bytes), m->start, m->end, 0, m->streamId},
                               static_cast<int>(m->deviceId),
                               m->correlationId});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
          if (m->start == 0 || m->end < m->start) break;
          s.records.push_back({{fmt::format("memset ({} bytes)", m->bytes), m->start, m->end, 0, m->streamId},
                               static_cast<int>(m->deviceId),
                               m->correlationId});
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(r);
          if (e->externalKind == kTagKind) s.tags[e->correlationId] = e->externalId;
          break;
        }
        default:  // the runtime and driver API records: only their external correlation is needed
          break;
      }
    }
  }
  std::free(buffer);
}

}  // namespace

std::string cupti_unavailable() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.ctl);
  load(s);
  return s.why;
}

void cupti_start() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.ctl);
  load(s);
  if (!s.why.empty()) throw UnsupportedError(s.why);
  if (s.users++ > 0) return;
  const Api& a = s.api;
  CUptiResult r = CUPTI_SUCCESS;
  if (!s.callbacks) {
    r = a.register_callbacks(buffer_requested, buffer_completed);
    s.callbacks = r == CUPTI_SUCCESS;
  }
  std::size_t on = 0;
  for (; r == CUPTI_SUCCESS && on < std::size(kKinds); ++on) r = a.enable(kKinds[on]);
  if (r != CUPTI_SUCCESS) {
    for (std::size_t k = 0; k + 1 < on; ++k) a.disable(kKinds[k]);
    --s.users;
    throw UnsupportedError(fmt::format(
        "CUPTI's activity records could not be turned on: {}{}", err(a, r),
        r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? "; is a profiler (nsys, ncu) attached?" : ""));
  }
}

void cupti_stop() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.ctl);
  if (s.users == 0 || --s.users > 0) return;
  s.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // what is still buffered is dropped, not kept for the next start
  for (CUpti_ActivityKind k : kKinds) s.api.disable(k);
  const std::lock_guard<std::mutex> r(s.rec);
  s.records.clear();
  s.tags.clear();
}

void cupti_push(std::uint64_t tag) {
  const Api& a = state().api;  // set once, before the first start; never changed while in use
  if (a.push != nullptr) a.push(kTagKind, tag);
}

void cupti_pop() {
  const Api& a = state().api;
  std::uint64_t last = 0;
  if (a.pop != nullptr) a.pop(kTagKind, &last);
}

std::uint64_t cupti_now_ns() {
  const Api& a = state().api;
  std::uint64_t t = 0;
  if (a.timestamp != nullptr && a.timestamp(&t) != CUPTI_SUCCESS) t = 0;
  return t;
}

std::vector<DeviceActivity> cupti_take(int device) {
  State& s = state();
  {
    const std::lock_guard<std::mutex> lock(s.ctl);
    if (s.users == 0) return {};
    // a forced flush calls buffer_completed on this thread, which takes `rec`
    const CUptiResult r = s.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS) throw Error(fmt::format("CUPTI: flushing the activity records failed: {}", err(s.api, r)));
  }
  const std::lock_guard<std::mutex> lock(s.rec);
  std::vector<DeviceActivity> mine;
  std::vector<Record> rest;
  for (auto& rec : s.records) {
    if (rec.device != device) {
      rest.push_back(std::move(rec));
      continue;
    }
    const auto t = s.tags.find(rec.correlation);
    if (t != s.tags.end()) rec.a.tag = t->second;
    mine.push_back(std::move(rec.a));
  }
  s.records = std::move(rest);
  if (s.records.empty()) s.tags.clear();  // every tagged launch is resolved
  std::sort(mine.begin(), mine.end(),
            [](const DeviceActivity& a, const DeviceActivity& b) { return a.start_ns < b.start_ns; });
  return mine;
}
#endif

}  // namespace stepbench::cuda
