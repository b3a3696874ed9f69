// The memory plan as data (memory_plan.hpp): the checker and the peaks per phase.
#include "graph/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>

namespace stepbench {

bool PlannedBuffer::live_at(int step) const {
  if (persistent) return true;
  for (const auto& i : live)
    if (i.first <= step && step <= i.last) return true;
  return false;
}

bool PlannedBuffer::overlaps_in_time(const PlannedBuffer& o) const {
  if (persistent || o.persistent) return true;
  std::size_t a = 0, b = 0;  // both ascending: a merge
  while (a < live.size() && b < o.live.size()) {
    if (live[a].last < o.live[b].first) {
      ++a;
    } else if (o.live[b].last < live[a].first) {
      ++b;
    } else {
      return true;
    }
  }
  return false;
}

std::size_t MemoryPlan::unshared_bytes() const {
  std::size_t n = 0;
  for (const auto& b : buffers) n += b.bytes;
  return n;
}

std::size_t MemoryPlan::persistent_bytes() const {
  std::size_t n = 0;
  for (const auto& b : buffers)
    if (b.persistent) n += b.bytes;
  return n;
}

namespace {

std::string step_name(const MemoryPlan& p, int s) {
  const PlanStep& st = p.steps[static_cast<std::size_t>(s)];
  return fmt::format("step {} ({}: {}{}{})", s, to_string(st.phase), st.label, st.label.empty() ? "" : " ", st.part);
}

std::string extent(const PlannedBuffer& b) {
  return fmt::format("'{}' [{}, {})", b.name, b.offset, b.offset + b.bytes);
}

// The buffers that hold memory at step s, by offset.
std::vector<const PlannedBuffer*> live_by_offset(const MemoryPlan& p, int s) {
  std::vector<const PlannedBuffer*> v;
  for (const auto& b : p.buffers)
    if (b.bytes && b.live_at(s)) v.push_back(&b);
  std::sort(v.begin(), v.end(), [](const PlannedBuffer* a, const PlannedBuffer* b) { return a->offset < b->offset; });
  return v;
}

}  // namespace

std::vector<std::string> plan_conflicts(const MemoryPlan& p, std::size_t max) {
  std::vector<std::string> out;
  for (const auto& b : p.buffers)
    if (b.bytes && b.offset + b.bytes > p.arena_bytes && out.size() < max)
      out.push_back(fmt::format("{} ends past the arena ({} bytes)", extent(b), p.arena_bytes));
  // Per step: sorted by offset, a buffer that starts before the furthest end so far overlaps the
  // buffer that reaches there. Each pair is told once, at the first step where both are live.
  std::set<std::pair<const PlannedBuffer*, const PlannedBuffer*>> told;
  for (int s = 0; s < static_cast<int>(p.steps.size()) && out.size() < max; ++s) {
    const PlannedBuffer* reach = nullptr;
    for (const PlannedBuffer* b : live_by_offset(p, s)) {
      if (reach && b->offset < reach->offset + reach->bytes && told.insert({reach, b}).second && out.size() < max)
        out.push_back(fmt::format("at {}: {} overlaps {}", step_name(p, s), extent(*reach), extent(*b)));
      if (!reach || b->offset + b->bytes > reach->offset + reach->bytes) reach = b;
    }
  }
  return out;
}

std::array<MemoryPeak, 4> memory_peaks(const MemoryPlan& p) {
  std::array<MemoryPeak, 4> peaks;
  for (std::size_t i = 0; i < peaks.size(); ++i) peaks[i].phase = static_cast<MemoryPhase>(i);
  for (int s = 0; s < static_cast<int>(p.steps.size()); ++s) {
    MemoryPeak here;
    here.phase = p.steps[static_cast<std::size_t>(s)].phase;
    here.step = s;
    for (const auto& b : p.buffers) {
      if (!b.live_at(s)) continue;
      // what the training step saves for backward is a plain activation in the inference forward
      const bool plain = b.kind == BufferKind::saved && here.phase == MemoryPhase::forward_only;
      here.bytes += b.bytes;
      here.by_kind[static_cast<std::size_t>(plain ? BufferKind::activations : b.kind)] += b.bytes;
    }
    MemoryPeak& best = peaks[static_cast<std::size_t>(here.phase)];
    if (best.step < 0 || here.bytes > best.bytes) best = here;
  }
  return peaks;
}

MemoryPeak overall_peak(const MemoryPlan& p) {
  MemoryPeak top;
  for (const auto& m : memory_peaks(p))
    if (m.step >= 0 && (top.step < 0 || m.bytes > top.bytes)) top = m;
  return top;
}

}  // namespace stepbench
