// Where a training step's numbers first stop being finite (Graph::parameters_finite,
// Graph::first_non_finite): a report for the step that blew up, made outside any timed region.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/conv_bn_relu.hpp"

namespace stepbench {
namespace {

// t's logical elements on the host as fp32 (any strides and storage type); synchronises s.
std::vector<float> host_values(Backend& be, Stream& s, const Tensor& t) {
  const TensorDesc& d = t.desc;
  if (!t.data || d.numel() == 0) return {};
  const std::int64_t span = d.offset(d.shape.n - 1, d.shape.c - 1, d.shape.h - 1, d.shape.w - 1) + 1;
  std::vector<float> raw(static_cast<std::size_t>(span));
  be.copy(s, raw.data(), t.data, static_cast<std::size_t>(span) * dtype_size(d.dtype));
  be.synchronize(s);
  if (d.dtype != DType::f32) {  // 16-bit values in the first half: widen from a copy
    std::vector<std::uint16_t> narrow(raw.size());
    std::memcpy(narrow.data(), raw.data(), narrow.size() * sizeof(std::uint16_t));
    convert(narrow.data(), d.dtype, raw.data(), DType::f32, raw.size());
  }
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(d.numel()));
  for (std::int64_t n = 0; n < d.shape.n; ++n)
    for (std::int64_t c = 0; c < d.shape.c; ++c)
      for (std::int64_t h = 0; h < d.shape.h; ++h)
        for (std::int64_t w = 0; w < d.shape.w; ++w) out.push_back(raw[static_cast<std::size_t>(d.offset(n, c, h, w))]);
  return out;
}

// Layer i's output as the step made it: its buffer, or for a fused unit's output that is not stored
// (GraphConfig::fuse) the unit's batch norm applied to its z, as its readers load it, here into memory
// of the check's own.
std::vector<float> output_values(Graph::Impl& g, Stream& s, std::size_t i, bool training) {
  const Layer& l = *g.layers[i];
  const auto* unit = dynamic_cast<const ConvBnReluLayer*>(&l);
  if (!unit || g.values[static_cast<std::size_t>(l.out)].stored)
    return host_values(g.be, s, g.values[static_cast<std::size_t>(l.out)].t);
  Buffer y(g.be, unit->zdesc.bytes()), ws(g.be, unit->bnu->apply_workspace_bytes());
  const Tensor yt{y.get(), unit->zdesc};
  unit->bnu->apply(s, Tensor{unit->z.get(), unit->zdesc}, unit->unit_norm(g, training), yt, ws.get());
  return host_values(g.be, s, yt);
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

std::string label(const LayerInfo& l, std::size_t index) {
  return l.name.empty() ? fmt::format("layer {} ({})", index, l.kind) : fmt::format("{} ({})", l.name, l.kind);
}

// The first trainable parameter (in registration order) with a non-finite element in the arena
// at p (n floats, device memory), or "". Read in chunks, so that the host never holds a second copy
// of the arena (104 MiB for Inception-v3: it showed in the process's peak resident memory).
std::string first_bad_param(Backend& be, Stream& s, const std::vector<ParamEntry>& params, const float* p,
                            std::size_t n) {
  constexpr std::size_t kChunk = std::size_t{1} << 20;      // floats
  std::vector<std::pair<std::size_t, std::size_t>> starts;  // (offset, index) of the trainable ones
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i].trainable) starts.emplace_back(params[i].offset, i);
  std::sort(starts.begin(), starts.end());
  std::vector<bool> bad(params.size(), false);
  std::vector<float> h(std::min(n, kChunk));
  for (std::size_t at = 0; at < n; at += kChunk) {
    const std::size_t k = std::min(kChunk, n - at);
    be.copy(s, h.data(), p + at, k * sizeof(float));
    be.synchronize(s);
    for (std::size_t j = 0; j < k; ++j) {
      if (std::isfinite(h[j])) continue;
      const std::size_t i = at + j;  // the parameter that holds it, if one does (not the alignment padding)
      auto it = std::upper_bound(starts.begin(), starts.end(), std::make_pair(i, params.size()));
      if (it == starts.begin()) continue;
      const ParamEntry& e = params[(--it)->second];
      if (i < e.offset + e.count) bad[it->second] = true;
    }
  }
  for (std::size_t i = 0; i < params.size(); ++i)
    if (bad[i]) return params[i].name;
  return "";
}

}  // namespace

bool Graph::parameters_finite(Stream& s) const {
  return first_bad_param(impl_->be, s, params(), param_arena(), param_arena_floats()).empty();
}

bool Graph::step_finite(Stream& s) const {
  if (!parameters_finite(s)) return false;
  // with loss scaling an overflowed gradient is expected now and then: the step is skipped
  return loss_scaler() || first_bad_param(impl_->be, s, params(), grad_arena(), param_arena_floats()).empty();
}

// Each layer's output is read right after its forward (a fused unit's unstored one made from its z),
// and the gradients it passes back right after its backward: the plan shares memory between buffers
// whose lifetimes do not overlap, so after the pass they may hold something else.
std::string Graph::first_non_finite(Stream& s) {
  Backend& be = impl_->be;
  if (auto p = first_bad_param(be, s, params(), param_arena(), param_arena_floats()); !p.empty())
    return fmt::format("the parameter {} (an update wrote it)", p);
  const auto ls = layers();
  std::string where;
  for (const bool training : {false, true}) {  // inference (running statistics), then training (batch statistics)
    const char* pass = training ? "training" : "inference";
    impl_->run_forward(s, training, [&](std::size_t i) {
      if (where.empty() && ls[i].out >= 0 && !all_finite(output_values(*impl_, s, i, training)))
        where = fmt::format("the output of {} in the {} forward", label(ls[i], i), pass);
    });
    if (!where.empty()) return where;
    if (!std::isfinite(loss(s))) return fmt::format("the loss of the {} forward (its logits are finite)", pass);
  }
  impl_->run_backward(s, {}, [&](std::size_t i) {
    for (ValueId v : ls[i].in)
      if (where.empty() && !all_finite(host_values(be, s, grad(v))))
        where = fmt::format("the gradient {} passes to its input in the backward", label(ls[i], i));
  });
  if (!where.empty()) return where;
  if (auto p = first_bad_param(be, s, params(), grad_arena(), param_arena_floats()); !p.empty())
    return fmt::format("the gradient of the parameter {}", p);
  return "";
}

}  // namespace stepbench
