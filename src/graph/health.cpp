// Where a training step's numbers first stop being finite (Graph::parameters_finite,
// Graph::first_non_finite): a report for the step that blew up, made outside any timed region.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"

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

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

std::string label(const LayerInfo& l, std::size_t index) {
  return l.name.empty() ? fmt::format("layer {} ({})", index, l.kind) : fmt::format("{} ({})", l.name, l.kind);
}

// The first trainable parameter (in registration order) with a non-finite element of the arena
// `a`, or "".
std::string first_bad_param(const std::vector<ParamEntry>& params, const std::vector<float>& a) {
  for (const auto& e : params)
    if (e.trainable)
      for (std::size_t i = e.offset; i < e.offset + e.count; ++i)
        if (!std::isfinite(a[i])) return e.name;
  return "";
}

std::vector<float> arena(Backend& be, Stream& s, const float* p, std::size_t n) {
  std::vector<float> h(n);
  if (n) be.copy(s, h.data(), p, n * sizeof(float));
  be.synchronize(s);
  return h;
}

}  // namespace

bool Graph::parameters_finite(Stream& s) const {
  return first_bad_param(params(), arena(impl_->be, s, param_arena(), param_arena_floats())).empty();
}

bool Graph::step_finite(Stream& s) const {
  if (!parameters_finite(s)) return false;
  // with loss scaling an overflowed gradient is expected now and then: the step is skipped
  return loss_scaler() || first_bad_param(params(), arena(impl_->be, s, grad_arena(), param_arena_floats())).empty();
}

std::string Graph::first_non_finite(Stream& s) {
  Backend& be = impl_->be;
  if (auto p = first_bad_param(params(), arena(be, s, param_arena(), param_arena_floats())); !p.empty())
    return fmt::format("the parameter {} (an update wrote it)", p);
  const auto ls = layers();
  for (const bool training : {false, true}) {  // inference (running statistics), then training (batch statistics)
    const char* pass = training ? "training" : "inference";
    forward(s, training);
    for (std::size_t i = 0; i < ls.size(); ++i)
      if (ls[i].out >= 0 && (training || !ls[i].training_only) && !all_finite(host_values(be, s, value(ls[i].out))))
        return fmt::format("the output of {} in the {} forward", label(ls[i], i), pass);
    if (!std::isfinite(loss(s))) return fmt::format("the loss of the {} forward (its logits are finite)", pass);
  }
  backward(s);
  for (std::size_t i = ls.size(); i-- > 0;)
    for (ValueId v : ls[i].in)
      if (!all_finite(host_values(be, s, grad(v))))
        return fmt::format("the gradient {} passes to its input in the backward", label(ls[i], i));
  if (auto p = first_bad_param(params(), arena(be, s, grad_arena(), param_arena_floats())); !p.empty())
    return fmt::format("the gradient of the parameter {}", p);
  return "";
}

}  // namespace stepbench
