// Backends by kind, with the settings every run applies before it makes ops.
#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "backend/plan_cache.hpp"
#include "tensor/names.hpp"

namespace stepbench {

enum class BackendKind { automatic, cpu, cuda };
constexpr auto enum_names(BackendKind) {
  return std::array<EnumName<BackendKind>, 3>{
      {{BackendKind::automatic, "auto"}, {BackendKind::cpu, "cpu"}, {BackendKind::cuda, "cuda"}}};
}

struct BackendOptions {
  BackendKind kind = BackendKind::cpu;
  int device = 0;                                        // CUDA device ordinal
  Precision precision = Precision::fp32;                 // tf32 turns tensor-op math on
  std::size_t workspace_bytes = std::size_t{512} << 20;  // cuDNN workspace per convolution (--workspace-mb)
  bool own_kernels = false;                              // cuda: see CudaBackendOptions
  // cpu, for tests only: bf16 convolution and inner product emulated on fp32 where oneDNN has no
  // bf16 kernel (cpu/bf16_emulation.cpp), so that require(bf16) passes there. The benchmark never
  // sets it; `stepbench check` does under STEPBENCH_EMULATE_BF16=1 (the parity tests). Where the CPU
  // has native bf16 it changes nothing.
  bool emulate_bf16 = false;
  std::size_t memory_limit_bytes = 0;  // Backend::set_memory_limit (0: none)
  int memory_share = 1;  // processes planning on this device at once (ranks sharing a GPU, processes on a host)
  // cuda: where convolution plans are looked up and recorded; shared by the backends of one process
  // (Towers passes one to each tower). Null: the backend keeps its own.
  std::shared_ptr<ConvPlanCache> plans;
};

// automatic: cuda when a GPU is visible, else cpu. Throws UnsupportedError when the backend cannot
// run here (no GPU, CUDA support not built).
std::unique_ptr<Backend> make_backend(const BackendOptions& o);
inline std::unique_ptr<Backend> make_backend(BackendKind kind, int device = 0) {
  BackendOptions o;
  o.kind = kind;
  o.device = device;
  return make_backend(o);
}
std::unique_ptr<Backend> make_cpu_backend(bool emulate_bf16 = false);  // BackendOptions::emulate_bf16
// automatic resolved against this machine: cuda when a GPU is usable, else cpu.
BackendKind resolve(BackendKind kind);
// Number of visible CUDA devices; 0 when none (or when built without CUDA). Never throws.
int cuda_device_count();
// Why no GPU is usable, or "" when one is.
std::string cuda_unavailable_reason();

}  // namespace stepbench
