// Which conv + BN units run as fused units and which of their outputs are not stored
// (GraphConfig::fuse, backend/fused.hpp), decided once before planning from the dataflow: a unit's
// output is left unstored where every reader can load it through the unit's batch norm (a
// convolution; a residual add, from a unit without ReLU), and it is none of the values that must
// stay readable (the input, a named output, a kept value, a concat's part). Only under sharing by
// liveness: with every value kept (BufferSharing) the graph runs unfused.
#include <cstddef>
#include <utility>
#include <vector>

#include "graph/graph_impl.hpp"
#include "graph/layers/conv_bn_relu.hpp"

namespace stepbench {

void mark_fused_units(Graph::Impl& g) {
  // with other sharing (every value readable after the step) nothing is fused: the unfused step
  const bool on = g.cfg.fuse == Fuse::on && g.cfg.sharing == BufferSharing::by_liveness;
  for (auto& l : g.layers) l->in_unit.assign(l->in.size(), nullptr);
  for (auto& v : g.values) v.stored = true;
  for (auto& l : g.layers)
    if (auto* u = dynamic_cast<ConvBnReluLayer*>(l.get())) u->fused = on, u->stored = true;
  if (!on) return;
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> readers(g.values.size());  // (layer, input)
  for (std::size_t i = 0; i < g.layers.size(); ++i)
    for (std::size_t k = 0; k < g.layers[i]->in.size(); ++k)
      readers[static_cast<std::size_t>(g.layers[i]->in[k])].emplace_back(i, k);
  for (std::size_t v = 0; v < g.values.size(); ++v) {
    Value& val = g.values[v];
    if (val.root >= 0 || val.producer < 0 || readers[v].empty()) continue;  // concat parts, the input, concats
    auto* unit = dynamic_cast<ConvBnReluLayer*>(g.layers[static_cast<std::size_t>(val.producer)].get());
    if (!unit || (v < g.kept.size() && g.kept[v])) continue;
    bool named = false;
    for (const auto& [name, id] : g.outputs) named = named || id == static_cast<ValueId>(v);
    bool all = !named;
    for (const auto& [i, k] : readers[v]) all = all && g.layers[i]->loads_normalised(k, unit->spec.relu);
    if (!all) continue;
    val.stored = false;
    unit->stored = false;
    for (const auto& [i, k] : readers[v]) g.layers[i]->in_unit[k] = unit;
  }
}

}  // namespace stepbench
