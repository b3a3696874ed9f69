// The memory plan sized without allocating (plan_memory) and the largest batch it accepts
// (largest_batch_that_fits), towers.hpp.
#include <map>
#include <memory>

#include "graph/graph.hpp"
#include "models/models.hpp"
#include "tensor/error.hpp"
#include "train/towers.hpp"

namespace stepbench {

GraphConfig graph_config(const TowerOptions& o, std::int64_t batch, std::uint64_t seed) {
  GraphConfig c{batch, o.layout, o.dtype(), seed};
  c.optimizer_state_arenas = optimizer_state_arenas(o.optimizer.kind);
  c.recompute = o.recompute;
  c.fuse = o.fuse;
  return c;
}

namespace {

std::unique_ptr<Backend> sizing_backend(const TowerOptions& o) {
  BackendOptions bo;
  bo.kind = resolve(o.backend);
  const TowerPlace place = tower_place(o, 0);  // this process's first GPU, as Towers places it
  bo.device = place.device;
  bo.memory_share = place.memory_share;
  bo.precision = o.precision;
  bo.workspace_bytes = o.workspace_bytes;
  bo.own_kernels = o.own_kernels;
  bo.memory_limit_bytes = o.memory_limit_bytes;
  bo.plans = o.plans;
  auto be = make_backend(bo);
  be->set_sizing_only(true);  // the graphs are sized, never run: no cudnnFind searches
  return be;
}

// The tower's graph at this batch on `be`, sized. An op that cannot be made at an absurd batch (a
// tensor past 2^31 elements) counts as not fitting in the exact plan.
Graph::Sizing size_on(Backend& be, const TowerOptions& o, std::int64_t batch, bool quick) {
  Graph g(be, graph_config(o, batch, 0));
  build_model(g, o.model, o.model_options);  // a bad model option throws here, whatever the batch
  try {
    return g.size_plan(quick);
  } catch (const UnsupportedError&) {
    throw;
  } catch (const Error& e) {
    if (quick) throw;
    Graph::Sizing r;
    r.refusal = e.what();
    return r;
  }
}

}  // namespace

Graph::Sizing plan_memory(const TowerOptions& o, std::int64_t batch, bool quick) {
  const auto be = sizing_backend(o);
  return size_on(*be, o, batch, quick);
}

BatchFit largest_batch_that_fits(const TowerOptions& o, std::int64_t cap) {
  const auto be = sizing_backend(o);
  BatchFit fit;
  fit.budget = be->memory_budget();
  auto quick = [&](std::int64_t b) { return size_on(*be, o, b, true).fits; };
  std::map<std::int64_t, Graph::Sizing> sized;  // the exact plans made
  auto exact = [&](std::int64_t b) -> const Graph::Sizing& {
    auto it = sized.find(b);
    return it != sized.end() ? it->second : sized.emplace(b, size_on(*be, o, b, false)).first->second;
  };
  // lo fits (or is 0), hi does not (or is past the cap)
  auto bisect = [](std::int64_t lo, std::int64_t hi, const auto& fits) {
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    return lo;
  };
  std::int64_t b = 0;
  if (quick(1)) {  // the lower bound: doubling, then bisection
    std::int64_t lo = 1, hi = 2;
    while (hi <= cap && quick(hi)) lo = hi, hi *= 2;
    b = hi > cap ? (quick(cap) ? cap : bisect(lo, cap, quick)) : bisect(lo, hi, quick);
  }
  // the exact plan accepts at most what the lower bound does: from there down, in growing steps
  // to a batch it accepts, then bisection
  if (b > 0 && !exact(b).fits) {
    std::int64_t hi = b, step = 1;
    b = 0;
    for (std::int64_t c = hi - 1; c > 0; c = hi - step) {
      if (exact(c).fits) {
        b = c;
        break;
      }
      hi = c;
      step *= 2;
    }
    b = bisect(b, hi, [&](std::int64_t x) { return exact(x).fits; });
  }
  fit.batch = b;
  fit.bytes = b ? exact(b).bytes : 0;
  fit.at_cap = b == cap;
  fit.next_bytes = fit.at_cap ? 0 : exact(b + 1).bytes;
  fit.usable = exact(b + (fit.at_cap ? 0 : 1)).usable;
  if (o.group && o.group->size() > 1) {  // every process must decide alike which batches run
    const double least = -o.group->allreduce_max(-static_cast<double>(fit.batch));
    if (least < static_cast<double>(fit.batch))
      fit.batch = static_cast<std::int64_t>(least), fit.bytes = 0, fit.next_bytes = 0;
  }
  return fit;
}

}  // namespace stepbench
