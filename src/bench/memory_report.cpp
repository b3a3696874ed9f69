// The memory plan in the report (memory_report.hpp).
#include "bench/memory_report.hpp"

#include <fmt/format.h>

#include <fstream>
#include <string>

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
  m.host = t.backend(0).name() == "cpu";
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
  std::string s = fmt::format("memory plan{}: peak {} in {} ({}); {}; arena {} ({} without sharing)\n",
                              m.towers > 1 ? " (per tower)" : "", bytes(top.bytes), to_string(top.phase), parts, phases,
                              bytes(m.arena), bytes(m.unshared));
  if (m.host && m.after.peak > 0) {
    const std::size_t above = m.after.peak > m.before.now ? m.after.peak - m.before.now : 0;
    s += fmt::format(
        "resident memory: peak {}, {} above the {} before the towers were built; the plan's arenas ({} x {}) are "
        "{:.0f}% of that\n",
        bytes(m.after.peak), bytes(above), bytes(m.before.now), m.towers, bytes(m.arena),
        above ? 100.0 * static_cast<double>(m.arena) * m.towers / static_cast<double>(above) : 0.0);
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
  if (m.host && m.after.peak > 0) j["resident"] = {{"before_towers_bytes", m.before.now}, {"peak_bytes", m.after.peak}};
  return j;
}

}  // namespace stepbench
