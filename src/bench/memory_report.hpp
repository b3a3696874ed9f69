// The step's memory plan in the report (graph/memory_plan.hpp): the peak bytes per phase and what
// holds them, one line in the summary and a "memory_plan" section in --json; on the cpu backend the
// process's resident memory beside it (/proc/self/status), which is where the plan's figure can be
// checked against what the step really touched.
#pragma once
#include <array>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "graph/memory_plan.hpp"
#include "train/towers.hpp"

namespace stepbench {

// The process's resident memory now and its high-water mark (VmRSS, VmHWM); zeros where the
// system does not say (no /proc).
struct ResidentMemory {
  std::size_t now = 0, peak = 0;
};
ResidentMemory resident_memory();
// The bytes of [p, p + n) in resident pages (mincore), for host memory; 0 where the system does not say.
std::size_t resident_bytes(const void* p, std::size_t n);

struct MemoryReport {
  int towers = 1;  // in this process; each has its own arena (CPU towers share the host's memory)
  std::size_t arena = 0, unshared = 0, persistent = 0;
  std::array<MemoryPeak, 4> peaks{};
  std::array<std::string, 4> where;  // the piece of work at each phase's peak
  bool host = false;                 // the arena is host memory (cpu backend): resident figures apply
  ResidentMemory before, after;      // before the towers were built, and now
  std::size_t arena_resident = 0;    // host: the towers' arenas' resident pages now (touched pages stay)
  std::size_t recomputed = 0;        // bytes of the buffers backward recomputes (GraphConfig::recompute)
  int recomputed_buffers = 0;
  // --peer's memory (PeerResult; zeros: none): its resident memory before its model was built and
  // its peak, and on CUDA torch.cuda.max_memory_allocated
  std::string peer_torch;
  std::size_t peer_baseline = 0, peer_peak = 0, peer_cuda = 0;
};
MemoryReport memory_report(const Towers& t, const ResidentMemory& before);

// "memory plan (per tower): peak ... in backward = weights ... ; forward-only ..., arena ..." and,
// on the cpu backend, a second line with the process's resident memory against it; with the peer's
// figures (one tower), a line with the ratio to PyTorch's (the process's peak on the cpu, the arena
// against torch.cuda.max_memory_allocated on a GPU).
std::string memory_lines(const MemoryReport& m);
nlohmann::json memory_json(const MemoryReport& m);

}  // namespace stepbench
