// Concatenation along channels (Graph::concat). Not a layer that runs: the parts become channel
// slices of the result's buffer (planning gives them views into it), so nothing is copied. A concat
// given as a part becomes a slice too (its parts move into the new one): DenseNet's prefixes.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "tensor/error.hpp"

namespace stepbench {

ValueId Graph::concat(const std::vector<ValueId>& parts) {
  auto& g = *impl_;
  SB_CHECK(!parts.empty(), "concat of nothing");
  Shape s = g.values.at(parts[0]).shape;
  s.c = 0;
  for (ValueId v : parts) {
    const Value& pv = g.values.at(v);
    SB_CHECK((pv.producer >= 0 || pv.producer == -2) && pv.root < 0,
             "concat parts must be layer outputs or concats, not already concatenated");
    SB_CHECK(pv.shape.n == s.n && pv.shape.h == s.h && pv.shape.w == s.w,
             fmt::format("concat: part {} does not match {}", to_string(pv.shape), to_string(s)));
    s.c += pv.shape.c;
  }
  const ValueId id = g.new_value(s, -1);
  std::int64_t off = 0;
  for (ValueId v : parts) {
    if (g.values[v].producer == -2)  // a concat: its parts move into this one, and it becomes a slice of it
      for (auto& inner : g.values)
        if (inner.root == v) inner.root = id, inner.c_offset += off;
    g.values[v].root = id;
    g.values[v].c_offset = off;
    off += g.values[v].shape.c;
  }
  g.values[id].producer = -2;  // produced by its parts
  return id;
}

std::vector<ValueId> Graph::concat_parts(ValueId v) const {
  const auto& g = *impl_;
  SB_CHECK(v >= 0 && static_cast<std::size_t>(v) < g.values.size(), fmt::format("no value {}", v));
  // a concat that became a slice of a later one: the layer outputs in its channels
  const Value& val = g.values[static_cast<std::size_t>(v)];
  const ValueId root = val.producer == -2 && val.root >= 0 ? val.root : v;
  const std::int64_t lo = root == v ? 0 : val.c_offset, hi = lo + val.shape.c;
  std::vector<std::pair<std::int64_t, ValueId>> parts;
  for (std::size_t i = 0; i < g.values.size(); ++i) {
    const Value& p = g.values[i];
    if (p.root == root && p.producer != -2 && p.c_offset >= lo && p.c_offset < hi)
      parts.emplace_back(p.c_offset, static_cast<ValueId>(i));
  }
  std::sort(parts.begin(), parts.end());
  std::vector<ValueId> r;
  r.reserve(parts.size());
  for (const auto& p : parts) r.push_back(p.second);
  return r;
}

}  // namespace stepbench
