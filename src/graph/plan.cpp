// Graph::plan(): lays out the parameter and state arenas, checks that the batch fits, sizes every
// activation, gradient, reserve and workspace buffer as a slot of one device arena, decides which
// gradients each layer overwrites or accumulates (fan-out), lets every layer create its backend
// ops, then allocates and places the arena.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/conv_bn_relu.hpp"
#include "graph/layers/layer.hpp"
#include "tensor/error.hpp"

namespace stepbench {

namespace {
constexpr std::size_t kAlignFloats = 16;  // 64-byte aligned parameters
std::size_t align_floats(std::size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
std::string limit_note(const Backend& be) {
  return be.memory_limit() && be.memory_limit() < be.memory_available()
             ? fmt::format(" (a memory limit of {} MiB is set)", be.memory_limit() >> 20)
             : "";
}
}  // namespace

void Graph::plan() { plan_to(PlanStage::all); }

std::size_t Graph::plan_dry(bool quick) {
  SB_CHECK(!impl_->planned && !impl_->dry_planned, "plan_dry after plan() or plan_dry()");
  const std::size_t bytes = plan_to(quick ? PlanStage::estimate : PlanStage::sized);  // throws when it does not fit
  return bytes;
}

std::size_t Graph::plan_to(PlanStage stage) {
  auto& g = *impl_;
  if (g.planned) return g.arena_bytes;
  SB_CHECK(!g.dry_planned, "a graph sized by plan_dry() cannot be planned again: build another");
  if (stage != PlanStage::all) g.dry_planned = true;  // spent, whether it fits or not
  SB_CHECK(g.input >= 0, "graph has no input");
  auto& be = g.be;

  // Arenas: trainable parameters in reverse execution order, state in execution order.
  // Parameters are registered in execution order.
  std::size_t off = 0;
  for (auto it = g.params.rbegin(); it != g.params.rend(); ++it) {
    auto& e = *it;
    if (!e.trainable) continue;
    e.offset = off;
    off += align_floats(e.count);
  }
  g.param_floats = off;
  off = 0;
  for (auto& e : g.params) {
    if (e.trainable) continue;
    e.offset = off;
    off += align_floats(e.count);
  }
  g.state_floats = off;

  // A batch too large for the device is a usage error before anything is allocated (on the CPU,
  // overcommitted memory would otherwise end in the OOM killer mid-step).
  {
    double need = 3.0 * static_cast<double>(g.param_floats) * sizeof(float);  // params, grads, optimizer state
    if (g.mixed()) need += 2.0 * static_cast<double>(g.param_floats) * 2;     // the 16-bit copies
    for (const auto& v : g.values)
      if (v.root < 0) need += static_cast<double>(g.desc(v.shape).bytes()) * (v.needs_grad ? 2 : 1);
    for (const auto& l : g.layers)
      if (dynamic_cast<const ConvBnReluLayer*>(l.get()))
        need += static_cast<double>(g.desc(g.values[l->out].shape).bytes());
    const double have = static_cast<double>(be.memory_budget());
    if (need > 0.9 * have) {
      const double per_image = need / static_cast<double>(g.cfg.batch);
      throw UsageError(fmt::format(
          "batch size {} needs about {:.1f} GiB on {} ({}) and {:.1f} GiB is available{}; use --batch-size {} or less",
          g.cfg.batch, need / (1 << 30), be.name(), be.device_name(), have / (1 << 30), limit_note(be),
          std::max<std::int64_t>(1, static_cast<std::int64_t>(0.8 * have / per_image))));
    }
    if (stage == PlanStage::estimate) {
      g.dry_planned = true;
      return static_cast<std::size_t>(need);
    }
  }
  g.reserve(g.param_arena, g.param_floats * sizeof(float));
  g.reserve(g.grad_arena, g.param_floats * sizeof(float));
  g.reserve(g.state_arena, std::max<std::size_t>(g.state_floats, 1) * sizeof(float));
  if (g.mixed()) {
    g.reserve(g.param_half, g.param_floats * 2);
    g.reserve(g.grad_half, g.param_floats * 2);
  }
  if (g.cfg.loss_scaling || g.cfg.dtype == DType::f16) g.reserve(g.scaler, LossScaler::kFloats * sizeof(float));

  // Activations and gradients: roots own slots, concat parts are channel slices of their root
  // (their tensors get data pointers once the arena is placed).
  for (auto& v : g.values) {
    if (v.root >= 0) continue;
    const TensorDesc d = g.desc(v.shape);
    g.reserve(v.data, d.bytes());
    v.t = Tensor{nullptr, d};
    if (v.needs_grad) {
      g.reserve(v.grad, d.bytes());
      v.g = Tensor{nullptr, d};
    }
  }
  for (auto& v : g.values) {
    if (v.root < 0) continue;
    const Value& r = g.values[v.root];
    v.t = Tensor{nullptr, r.t.desc};
    v.t.desc.shape.c = v.shape.c;
    if (v.needs_grad) v.g = Tensor{nullptr, v.t.desc};
  }

  // Fan-out: walking backward, the first writer of a gradient overwrites it, later ones add.
  std::vector<bool> written(g.values.size(), false);
  std::vector<bool> part_has_consumer(g.values.size(), false);
  for (auto& l : g.layers)
    for (ValueId v : l->in)
      if (g.values[v].root >= 0) part_has_consumer[g.values[v].root] = true;
  for (std::size_t i = 0; i < g.values.size(); ++i)
    if (part_has_consumer[i]) g.values[i].grad_zero_first = true;  // mixed writers: zero, then add
  for (auto it = g.layers.rbegin(); it != g.layers.rend(); ++it) {
    auto& l = **it;
    l.in_beta.assign(l.in.size(), 0.0f);
    for (std::size_t k = 0; k < l.in.size(); ++k) {
      const ValueId v = l.in[k];
      const Value& val = g.values[v];
      const ValueId r = val.root >= 0 ? val.root : v;
      const bool init = written[v] || written[r] || g.values[r].grad_zero_first;
      l.in_beta[k] = init ? 1.0f : 0.0f;
      written[v] = true;
    }
  }
  // A gradient nobody writes (an output without a loss) must read as zero.
  for (std::size_t i = 0; i < g.values.size(); ++i) {
    auto& v = g.values[i];
    if (v.root < 0 && v.needs_grad && !written[i] && !v.grad_zero_first) {
      bool any_part_written = false;
      for (std::size_t j = 0; j < g.values.size(); ++j)
        if (g.values[j].root == static_cast<ValueId>(i) && written[j]) any_part_written = true;
      if (!any_part_written) v.grad_zero_first = true;
    }
  }

  for (auto& l : g.layers) l->plan(g);
  std::size_t ws = 0, scratch = 0;
  for (auto& l : g.layers) {
    ws = std::max(ws, l->workspace_bytes());
    scratch = std::max(scratch, l->scratch_bytes());
  }
  g.reserve(g.workspace, ws);
  g.reserve(g.scratch, scratch);
  g.reserve(g.labels, sizeof(std::int32_t) * static_cast<std::size_t>(g.cfg.batch));
  g.reserve(g.losses, sizeof(float) * static_cast<std::size_t>(std::max(g.num_losses, 1)));

  // The arena: every byte the graph uses on the device, in one allocation, checked first.
  const std::size_t have = be.memory_budget();
  if (static_cast<double>(g.arena_bytes) > 0.95 * static_cast<double>(have)) {
    const double per_image = static_cast<double>(g.arena_bytes) / static_cast<double>(g.cfg.batch);
    throw UsageError(fmt::format(
        "batch size {} needs {} bytes ({:.2f} GiB) of {} memory on {} and {} bytes ({:.2f} GiB) are available{}; "
        "use --batch-size {} or less",
        g.cfg.batch, g.arena_bytes, g.arena_bytes / 1073741824.0, be.name(), be.device_name(), have,
        have / 1073741824.0, limit_note(be),
        std::max<std::int64_t>(1, static_cast<std::int64_t>(0.8 * have / per_image))));
  }
  if (stage == PlanStage::sized) {
    g.dry_planned = true;
    return g.arena_bytes;
  }
  g.arena = Buffer(be, g.arena_bytes);
  for (Slot* sl : g.slots) sl->base = g.arena.as<char>();
  for (auto& v : g.values) {
    if (v.root >= 0) continue;
    v.t.data = v.data.get();
    if (v.needs_grad) v.g.data = v.grad.get();
  }
  for (auto& v : g.values) {
    if (v.root < 0) continue;
    const Value& r = g.values[v.root];
    v.t = r.t.channel_slice(v.c_offset, v.shape.c);
    if (v.needs_grad) v.g = r.g.channel_slice(v.c_offset, v.shape.c);
  }
  auto& st = be.default_stream();
  for (Slot* sl : {&g.param_arena, &g.grad_arena, &g.state_arena, &g.grad_half, &g.labels, &g.losses})
    if (sl->size) be.memset_zero(st, sl->get(), sl->size);
  if (g.scaler.size) {
    const float init[LossScaler::kFloats] = {g.cfg.initial_loss_scale, 0.0f, 0.0f};
    be.copy(st, g.scaler.get(), init, sizeof init);
  }
  be.synchronize(st);
  // Walking backward, the gradients of every layer from the last down to this one are final: with
  // the arena in reverse execution order they are a prefix of it.
  std::size_t ready = 0;
  for (auto it = g.layers.rbegin(); it != g.layers.rend(); ++it) {
    for (std::size_t p : (*it)->trainable)
      ready = std::max(ready, std::min(g.params[p].offset + align_floats(g.params[p].count), g.param_floats));
    (*it)->ready_after = ready;
  }
  g.planned = true;
  return g.arena_bytes;
}

bool Graph::planned() const { return impl_->planned; }

}  // namespace stepbench
