// largest_batch_that_fits (towers.hpp): planning's memory checks, bisected over the batch size.
#include <memory>

#include "graph/graph.hpp"
#include "models/models.hpp"
#include "tensor/error.hpp"
#include "train/towers.hpp"

namespace stepbench {

GraphConfig graph_config(const TowerOptions& o, std::int64_t batch, std::uint64_t seed) {
  GraphConfig c{batch, o.layout, o.dtype(), seed};
  c.optimizer_state_arenas = optimizer_state_arenas(o.optimizer.kind);
  return c;
}

BatchFit largest_batch_that_fits(const TowerOptions& o, std::int64_t cap) {
  BackendOptions bo;
  bo.kind = resolve(o.backend);
  bo.device = o.group ? o.group->local_rank() * o.towers : 0;  // this process's first GPU, as Towers places it
  bo.precision = o.precision;
  bo.workspace_bytes = o.workspace_bytes;
  bo.own_kernels = o.own_kernels;
  bo.memory_limit_bytes = o.memory_limit_bytes;
  bo.plans = o.plans;
  const auto be = make_backend(bo);
  be->set_sizing_only(true);  // the graphs below are sized, never run: no cudnnFind searches
  BatchFit fit;
  fit.budget = be->memory_budget();
  // bytes needed, or 0 when planning refuses the batch for its memory
  auto needs = [&](std::int64_t batch, bool quick) -> std::size_t {
    Graph g(*be, graph_config(o, batch, 0));
    build_model(g, o.model, o.model_options);  // a bad model option throws here, whatever the batch
    try {
      return g.plan_dry(quick);
    } catch (const UnsupportedError&) {
      throw;
    } catch (const UsageError&) {
      return 0;
    } catch (const Error&) {
      if (quick) throw;
      return 0;  // sizing the ops at an absurd batch (cuDNN's search, a tensor past 2^31 elements) failed
    }
  };
  std::size_t bytes = 0;  // what the last batch that fitted the exact check needs
  auto largest = [&](std::int64_t lo, std::int64_t hi, bool quick) {  // lo fits (or is 0), hi does not
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      const std::size_t n = needs(mid, quick);
      if (n && !quick) bytes = n;
      (n ? lo : hi) = mid;
    }
    return lo;
  };
  if (!needs(1, true)) return fit;
  std::int64_t lo = 1, hi = 2;
  while (hi <= cap && needs(hi, true)) lo = hi, hi *= 2;
  std::int64_t b = hi > cap ? (needs(cap, true) ? cap : largest(lo, cap, true)) : largest(lo, hi, true);
  // the exact check (every buffer and op sized) may refuse what the estimate let through
  bytes = needs(b, false);
  if (!bytes) b = largest(0, b, false);
  fit.batch = b;
  fit.bytes = b ? bytes : 0;
  fit.at_cap = b == cap;
  if (o.group && o.group->size() > 1) {  // every process must decide alike which batches run
    const double least = -o.group->allreduce_max(-static_cast<double>(fit.batch));
    if (least < static_cast<double>(fit.batch)) fit.batch = static_cast<std::int64_t>(least), fit.bytes = 0;
  }
  return fit;
}

}  // namespace stepbench
