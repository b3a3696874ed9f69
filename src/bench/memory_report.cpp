// The memory plan in the report (memory_report.hpp).
#include "bench/memory_report.hpp"

#include <fmt/format.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace stepbench {

ResidentMemory resident_memory() {
  ResidentMemory r;
  std::ifstream f("/proc/self/status");
  std::string key;
  std::size_t kb = 0;
  std::string unit;
  while (f >> key) {
    if (key == "VmRSS:" && f >> kb >> unit) r.now = kb * 1024;
    if (key == "VmHWM:" && f >> kb >> unit) r.peak = kb * 1024;
  }
  return r;
}

std::size_t resident_bytes(const void* p, std::size_t n) {
  const long page = sysconf(_SC_PAGESIZE);
  if (!p || n == 0 || page <= 0) return 0;
  const auto ps = static_cast<std::uintptr_t>(page);
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p), first = a / ps * ps, end = a + n;
  std::vector<unsigned char> v((end - first + ps - 1) / ps);
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the page the range starts in, as mincore wants it
  if (mincore(reinterpret_cast<void*>(first), end - first, v.data()) != 0) return 0;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!(v[i] & 1)) continue;
    const std::uintptr_t lo = std::max(a, first + i * ps), hi = std::min(end, first + (i + 1) * ps);
    bytes += hi - lo;
  }
  return bytes;
}

MemoryReport memory_report(const Towers& t, const ResidentMemory& before) {
  MemoryReport m;
  const Graph& g = t.graph(0);
  const MemoryPlan& p = g.memory_plan();
  m.towers = t.size();
  m.arena = p.arena_bytes;
  m.unshared = p.unshared_bytes();
  m.persistent = p.persistent_bytes();
  m.peaks = memory_peaks(p);
  for (std::size_t i = 0; i < m.peaks.size(); ++i) {
    const int s = m.peaks[i].step;
    if (s < 0) continue;
    const PlanStep& st = p.steps[static_cast<std::size_t>(s)];
    m.where[i] = st.label.empty() ? st.part : st.label + " " + st.part;
  }
  for (const auto& b : p.buffers)
    if (b.recomputed) m.recomputed += b.bytes, ++m.recomputed_buffers;
  m.host = t.backend(0).name() == "cpu";
  if (m.host)
    for (int i = 0; i < t.size(); ++i)
      m.arena_resident += resident_bytes(t.graph(i).arena_data(), t.graph(i).device_bytes());
  m.before = before;
  m.after = resident_memory();
  return m;
}

namespace {
double gib(std::size_t b) { return static_cast<double>(b) / 1073741824.0; }
// "1.23 GiB", "45.6 MiB", "12 KiB"
std::string bytes(std::size_t b) {
  if (b >= (std::size_t{1} << 30)) return fmt::format("{:.2f} GiB", gib(b));
  if (b >= (std::size_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / 1048576.0);
  return fmt::format("{:.0f} KiB", static_cast<double>(b) / 1024.0);
}
constexpr std::array<const char*, kBufferKinds> kShort{
    "weights", "gradients", "optimizer", "io", "saved activations", "activations", "activation gradients", "workspace"};
}  // namespace

std::string memory_lines(const MemoryReport& m) {
  MemoryPeak top;
  for (const auto& p : m.peaks)
    if (p.step >= 0 && (top.step < 0 || p.bytes > top.bytes)) top = p;
  std::string parts, phases;
  for (std::size_t k = 0; k < kBufferKinds; ++k)
    if (top.by_kind[k]) parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", kShort[k], bytes(top.by_kind[k]));
  for (const auto& p : m.peaks)
    if (p.step >= 0 && p.phase != top.phase)
      phases += fmt::format("{}{} {}", phases.empty() ? "" : ", ", to_string(p.phase), bytes(p.bytes));
  std::string s = fmt::format(
      "memory plan{}: peak {} in {} ({}); {}; arena {} ({} without sharing{})\n", m.towers > 1 ? " (per tower)" : "",
      bytes(top.bytes), to_string(top.phase), parts, phases, bytes(m.arena), bytes(m.unshared),
      m.recomputed_buffers ? fmt::format("; {} outputs, {}, recomputed in backward: --recompute off keeps them",
                                         m.recomputed_buffers, bytes(m.recomputed))
                           : "");
  if (m.host && m.after.peak > 0) {
    const std::size_t above = m.after.peak > m.before.now ? m.after.peak - m.before.now : 0;
    const std::size_t planned = m.arena * static_cast<std::size_t>(m.towers);
    s += fmt::format(
        "resident memory: peak {}, {} above the {} before the towers were built; the plan's arenas ({} x {}) are "
        "{:.0f}% of that{}\n",
        bytes(m.after.peak), bytes(above), bytes(m.before.now), m.towers, bytes(m.arena),
        above ? 100.0 * static_cast<double>(planned) / static_cast<double>(above) : 0.0,
        m.arena_resident
            ? fmt::format(" (resident: {} of their pages), the rest, at most {}, outside the plan "
                          "(oneDNN's kernels, threads, the input batch)",
                          bytes(m.arena_resident), bytes(above > m.arena_resident ? above - m.arena_resident : 0))
            : "");
  }
  if (m.towers == 1 && m.host && m.peer_peak > 0 && m.after.peak > 0) {
    const std::size_t above = m.after.peak > m.before.now ? m.after.peak - m.before.now : 0;
    const std::size_t peer_above = m.peer_peak > m.peer_baseline ? m.peer_peak - m.peer_baseline : 0;
    s += fmt::format(
        "against PyTorch {}: the process's peak {} to its {}, {:.2f}x; above what each held before its model was "
        "built, {} to {}, {:.2f}x\n",
        m.peer_torch, bytes(m.after.peak), bytes(m.peer_peak),
        static_cast<double>(m.after.peak) / static_cast<double>(m.peer_peak), bytes(above), bytes(peer_above),
        peer_above ? static_cast<double>(above) / static_cast<double>(peer_above) : 0.0);
  } else if (m.towers == 1 && !m.host && m.peer_cuda > 0) {
    s += fmt::format("against PyTorch {}: the plan's arena {} to torch.cuda.max_memory_allocated {}, {:.2f}x\n",
                     m.peer_torch, bytes(m.arena), bytes(m.peer_cuda),
                     static_cast<double>(m.arena) / static_cast<double>(m.peer_cuda));
  }
  return s;
}

nlohmann::json memory_json(const MemoryReport& m) {
  nlohmann::json phases = nlohmann::json::object();
  for (std::size_t i = 0; i < m.peaks.size(); ++i) {
    const MemoryPeak& p = m.peaks[i];
    if (p.step < 0) continue;
    nlohmann::json by = nlohmann::json::object();
    for (std::size_t k = 0; k < kBufferKinds; ++k)
      by[std::string(to_string(static_cast<BufferKind>(k)))] = p.by_kind[k];
    std::string name(to_string(p.phase));
    for (auto& ch : name)
      if (ch == ' ' || ch == '-') ch = '_';
    phases[name] = {{"peak_bytes", p.bytes}, {"at", m.where[i]}, {"by_kind", by}};
  }
  nlohmann::json j{{"towers_per_process", m.towers},
                   {"arena_bytes", m.arena},
                   {"unshared_bytes", m.unshared},
                   {"persistent_bytes", m.persistent},
                   {"phases", phases}};
  j["recomputed_bytes"] = m.recomputed;
  j["recomputed_buffers"] = m.recomputed_buffers;
  if (m.host && m.after.peak > 0)
    j["resident"] = {{"before_towers_bytes", m.before.now},
                     {"peak_bytes", m.after.peak},
                     {"arena_resident_bytes", m.arena_resident}};
  if (m.peer_peak > 0 || m.peer_cuda > 0) {
    j["peer"] = {{"torch", m.peer_torch},
                 {"baseline_rss_bytes", m.peer_baseline},
                 {"peak_rss_bytes", m.peer_peak},
                 {"cuda_max_allocated_bytes", m.peer_cuda}};
  }
  return j;
}

}  // namespace stepbench
