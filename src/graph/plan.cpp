// Graph::plan(): lays out the parameter and state arenas, decides which gradients each layer
// overwrites or accumulates (fan-out), plans every buffer's lifetime from the layers' declarations
// (liveness.cpp) and checks an estimate of the memory against the device, lets every layer create
// its backend ops, places every buffer in the one device arena (assign.cpp), verifies the plan
// (memory_plan.cpp), checks the exact arena, then allocates it.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"
#include "graph/liveness.hpp"
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
constexpr double kUsable = 0.95;  // of the budget: the rest for what the libraries allocate on their own

// Trainable parameters in reverse execution order, state in execution order (parameters are
// registered in execution order).
void lay_out_parameters(Graph::Impl& g) {
  std::size_t off = 0;
  for (auto it = g.params.rbegin(); it != g.params.rend(); ++it) {
    if (!it->trainable) continue;
    it->offset = off;
    off += align_floats(it->count);
  }
  g.param_floats = off;
  off = 0;
  for (auto& e : g.params) {
    if (e.trainable) continue;
    e.offset = off;
    off += align_floats(e.count);
  }
  g.state_floats = off;
  g.param_arena.size = g.grad_arena.size = g.param_floats * sizeof(float);
  g.state_arena.size = std::max<std::size_t>(g.state_floats, 1) * sizeof(float);
  g.param_half.size = g.grad_half.size = g.mixed() ? g.param_floats * 2 : 0;
  g.scaler.size = g.cfg.loss_scaling || g.cfg.dtype == DType::f16 ? LossScaler::kFloats * sizeof(float) : 0;
  SB_CHECK(g.cfg.optimizer_state_arenas >= 0 && g.cfg.optimizer_state_arenas <= 2,
           fmt::format("optimizer_state_arenas {} (0 to 2)", g.cfg.optimizer_state_arenas));
  for (int i = 0; i < 2; ++i) g.opt_state[i].size = i < g.cfg.optimizer_state_arenas ? g.param_arena.size : 0;
  g.labels.size = sizeof(std::int32_t) * static_cast<std::size_t>(g.cfg.batch);
  g.losses.size = sizeof(float) * static_cast<std::size_t>(std::max(g.num_losses, 1));
}

// Activation and gradient views without memory yet: roots get dense tensors, concat parts channel
// slices of their root (the ops are made from these descriptors).
void describe_values(Graph::Impl& g) {
  for (auto& v : g.values) {
    if (v.root >= 0) continue;
    v.t = Tensor{nullptr, g.desc(v.shape)};
    if (v.needs_grad) v.g = Tensor{nullptr, v.t.desc};
  }
  for (auto& v : g.values) {
    if (v.root < 0) continue;
    v.t = Tensor{nullptr, g.values[v.root].t.desc};
    v.t.desc.shape.c = v.shape.c;
    if (v.needs_grad) v.g = Tensor{nullptr, v.t.desc};
  }
}

// Fan-out: walking backward, the first writer of a gradient overwrites it, later ones add.
void fan_out(Graph::Impl& g) {
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
      const ValueId r = g.root_id(v);
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
}

// UsageError when `need` bytes do not fit in what planning may use: the bytes needed and available,
// and a batch that would fit (the batch-independent part of the plan kept, the rest scaled).
void check_fits(Graph::Impl& g, std::size_t need, bool estimate) {
  const Backend& be = g.be;
  g.needed_bytes = need;
  const std::size_t have = be.memory_budget();
  const double usable = kUsable * static_cast<double>(have);
  if (static_cast<double>(need) <= usable) return;
  const double fixed = static_cast<double>(std::min(g.mem.persistent_bytes(), need));
  const double per_image = std::max(1.0, (static_cast<double>(need) - fixed) / static_cast<double>(g.cfg.batch));
  const auto fits = std::max<std::int64_t>(1, static_cast<std::int64_t>((usable - fixed) / per_image));
  // where nothing is recomputed and something could be, the other way to fit
  const bool could_recompute =
      !recomputes(g.cfg.recompute, be.kind()) && g.cfg.sharing == BufferSharing::by_liveness &&
      std::any_of(g.layers.begin(), g.layers.end(), [](const auto& l) { return l->recomputes_output(); });
  throw UsageError(fmt::format(
      "batch size {} needs {}{} bytes ({:.2f} GiB{}) of {} memory on {} and {} bytes ({:.2f} GiB) are available{}, of "
      "which planning uses {:.0f}%; use --batch-size {} or less{}",
      g.cfg.batch, estimate ? "at least " : "", need, static_cast<double>(need) / 1073741824.0,
      estimate ? ": the plan's peak before the ops' workspace and reserves" : ": the plan's arena", be.name(),
      be.device_name(), have, static_cast<double>(have) / 1073741824.0, limit_note(be), 100 * kUsable, fits,
      could_recompute ? ", or try --recompute on (less memory per image: the conv + BN outputs made again in backward, "
                        "not kept)"
                      : ""));
}

// Walking backward, the gradients of every layer from the last down to this one are final: with
// the arena in reverse execution order they are a prefix of it.
void mark_ready_prefixes(Graph::Impl& g) {
  std::size_t ready = 0;
  for (auto it = g.layers.rbegin(); it != g.layers.rend(); ++it) {
    for (std::size_t p : (*it)->trainable)
      ready = std::max(ready, std::min(g.params[p].offset + align_floats(g.params[p].count), g.param_floats));
    (*it)->ready_after = ready;
  }
}

// The arena allocated and every slot, value and gradient given its memory; the arenas zeroed.
void place(Graph::Impl& g) {
  auto& be = g.be;
  g.arena = Buffer(be, g.arena_bytes);
  for (Slot* sl : g.mem_slots) sl->base = g.arena.as<char>();
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
}

}  // namespace

void Graph::plan() { plan_to(PlanStage::all); }

Graph::Sizing Graph::size_plan(bool quick) {
  SB_CHECK(!impl_->planned && !impl_->dry_planned, "plan_dry after plan() or plan_dry()");
  Sizing r;
  r.usable = static_cast<std::size_t>(kUsable * static_cast<double>(impl_->be.memory_budget()));
  try {
    r.bytes = plan_to(quick ? PlanStage::estimate : PlanStage::sized);
    r.fits = true;
  } catch (const UnsupportedError&) {
    throw;
  } catch (const UsageError& e) {  // check_fits: the bytes are in needed_bytes
    r.bytes = impl_->needed_bytes;
    r.refusal = e.what();
  }
  return r;
}

std::size_t Graph::plan_dry(bool quick) {
  const Sizing r = size_plan(quick);
  if (!r.fits) throw UsageError(r.refusal);
  return r.bytes;
}

std::size_t Graph::plan_to(PlanStage stage) {
  auto& g = *impl_;
  if (g.planned) return g.arena_bytes;
  SB_CHECK(!g.dry_planned, "a graph sized by plan_dry() cannot be planned again: build another");
  if (stage != PlanStage::all) g.dry_planned = true;  // spent, whether it fits or not
  SB_CHECK(g.input >= 0, "graph has no input");

  lay_out_parameters(g);
  mark_fused_units(g);
  describe_values(g);
  fan_out(g);
  plan_lifetimes(g);
  // A batch too large for the device is a usage error before any op is made (cuDNN's algorithm
  // search) or anything allocated (on the CPU, overcommitted memory would otherwise end in the OOM
  // killer mid-step): the peak of what the plan holds at once, a lower bound of its arena.
  const std::size_t estimate = overall_peak(g.mem).bytes;
  check_fits(g, estimate, true);
  if (stage == PlanStage::estimate) return estimate;

  for (auto& l : g.layers) l->plan(g);
  refresh_sizes(g);
  assign_offsets(g.mem);
  for (std::size_t i = 0; i < g.mem_slots.size(); ++i) g.mem_slots[i]->offset = g.mem.buffers[i].offset;
  // The checker is cheap (milliseconds for Inception-v3, against seconds for making its ops) and a
  // plan that let two live buffers overlap would corrupt the step silently: it runs every time.
  if (const auto bad = plan_conflicts(g.mem); !bad.empty())
    throw Error(
        fmt::format("the memory plan overlaps live buffers ({} found; a bug): {}", bad.size(), fmt::join(bad, "; ")));
  g.arena_bytes = g.mem.arena_bytes;
  check_fits(g, g.arena_bytes, false);
  if (stage == PlanStage::sized) return g.arena_bytes;

  place(g);
  mark_ready_prefixes(g);
  g.planned = true;
  return g.arena_bytes;
}

bool Graph::planned() const { return impl_->planned; }

}  // namespace stepbench
