// Offsets for the memory plan (liveness.hpp): the persistent buffers first, then greedy by size,
// best fit among the buffers already placed that are live at the same time.
#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "graph/liveness.hpp"

namespace stepbench {

namespace {
int first_step(const PlannedBuffer& b) { return b.live.empty() ? 0 : b.live.front().first; }
}  // namespace

void assign_offsets(MemoryPlan& p) {
  std::size_t end = 0;
  for (auto& b : p.buffers)
    if (b.persistent) {
      b.offset = end;
      end += b.bytes;
    }
  const std::size_t base = end;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < p.buffers.size(); ++i)
    if (!p.buffers[i].persistent && p.buffers[i].bytes) order.push_back(i);
  // the largest first (ties: the earliest live, then the first declared): what must fit goes in
  // while the arena is empty, the small ones fill the gaps around them
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto &x = p.buffers[a], &y = p.buffers[b];
    if (x.bytes != y.bytes) return x.bytes > y.bytes;
    return first_step(x) < first_step(y);
  });
  std::vector<const PlannedBuffer*> placed, conflicts;
  for (std::size_t i : order) {
    PlannedBuffer& b = p.buffers[i];
    conflicts.clear();
    for (const PlannedBuffer* o : placed)
      if (o->overlaps_in_time(b)) conflicts.push_back(o);
    std::sort(conflicts.begin(), conflicts.end(),
              [](const PlannedBuffer* x, const PlannedBuffer* y) { return x->offset < y->offset; });
    // the smallest gap between the conflicting buffers that holds b, else past the last of them
    std::size_t at = base, best = 0, best_gap = 0;
    bool found = false;
    for (const PlannedBuffer* o : conflicts) {
      if (o->offset >= at) {
        const std::size_t gap = o->offset - at;
        if (gap >= b.bytes && (!found || gap < best_gap)) best = at, best_gap = gap, found = true;
      }
      at = std::max(at, o->offset + o->bytes);
    }
    b.offset = found ? best : at;
    placed.push_back(&b);
    end = std::max(end, b.offset + b.bytes);
  }
  p.arena_bytes = end;
}

}  // namespace stepbench
