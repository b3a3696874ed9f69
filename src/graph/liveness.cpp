// Lifetimes for the memory plan (liveness.hpp): the schedule of the step from the layers'
// declarations, and for every buffer the steps from the first piece that touches it to the last, in
// each of the two passes that share the arena (the inference forward; the training step).
#include "graph/liveness.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/layers/layer.hpp"
#include "tensor/error.hpp"

namespace stepbench {

// ---- what a layer declares -------------------------------------------------------------------
Uses::Uses(Graph::Impl& g, int /*layer*/, std::string label, bool training)
    : g_(g), label_(std::move(label)), training_(training) {}

Uses& Uses::forward(const char* part) {
  pieces_.push_back({false, part, {}});
  return *this;
}
Uses& Uses::backward(const char* part) {
  SB_CHECK(training_, fmt::format("{}: a backward piece declared for the inference forward", label_));
  pieces_.push_back({true, part, {}});
  return *this;
}
Uses& Uses::use(Slot& s, Access a) {
  SB_CHECK(!pieces_.empty(), fmt::format("{}: a buffer declared before its piece (forward() or backward())", label_));
  pieces_.back().uses.emplace_back(&s, a);
  return *this;
}
bool Uses::needs_grad(ValueId v) const { return g_.values[v].needs_grad; }
Uses& Uses::reads(ValueId v) { return use(g_.values[g_.root_id(v)].data, Access::read); }
Uses& Uses::writes(ValueId v) { return use(g_.values[g_.root_id(v)].data, Access::write); }
Uses& Uses::reads_grad(ValueId v) {
  Value& r = g_.values[g_.root_id(v)];
  return r.needs_grad ? use(r.grad, Access::read) : *this;
}
Uses& Uses::writes_grad(ValueId v, float beta) {
  Value& r = g_.values[g_.root_id(v)];
  return r.needs_grad ? use(r.grad, beta == 0.0f ? Access::write : Access::update) : *this;
}
Uses& Uses::reads(Slot& s, const char* what) {
  names_[&s] = what;
  return use(s, Access::read);
}
Uses& Uses::writes(Slot& s, const char* what) {
  names_[&s] = what;
  return use(s, Access::write);
}
Uses& Uses::scratch(Slot& s, const char* what) {
  names_[&s] = what;
  return use(s, Access::scratch);
}

namespace {

constexpr std::size_t kAlign = 256;  // what cuDNN and vector loads like
std::size_t aligned(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string layer_label(const Layer& l, std::size_t i) {
  const LayerInfo info = l.info();
  return info.label.empty() ? fmt::format("{}_{}", info.kind, i) : info.label;
}

// The plan's buffers and the slots they are placed into, in registration order (the persistent
// ones are laid out in it).
struct Table {
  Graph::Impl& g;
  std::map<const Slot*, int> index;
  std::vector<bool> forward_touched, scratch;
  int add(Slot& s, std::string name, BufferKind kind, bool persistent) {
    SB_CHECK(!index.count(&s), fmt::format("planning: buffer '{}' registered twice", name));
    const int id = static_cast<int>(g.mem.buffers.size());
    PlannedBuffer b;
    b.name = std::move(name);
    b.kind = kind;
    b.persistent = persistent;
    g.mem.buffers.push_back(std::move(b));
    g.mem_slots.push_back(&s);
    forward_touched.push_back(false);
    scratch.push_back(false);
    index[&s] = id;
    return id;
  }
};

std::string value_name(const Graph::Impl& g, const std::vector<std::string>& labels, ValueId v) {
  if (v == g.input) return "input";
  for (const auto& [name, id] : g.outputs)
    if (id == v) return name;
  const Value& val = g.values[static_cast<std::size_t>(v)];
  if (val.producer >= 0) return labels[static_cast<std::size_t>(val.producer)] + " output";
  for (std::size_t i = 0; i < g.values.size(); ++i)  // a concat: named by its first part
    if (g.values[i].root == v && g.values[i].producer >= 0)
      return fmt::format("concat({}, ...)", labels[static_cast<std::size_t>(g.values[i].producer)]);
  return fmt::format("value {}", v);
}

void register_graph_buffers(Graph::Impl& g, Table& t, const std::vector<std::string>& labels) {
  t.add(g.param_arena, "parameters", BufferKind::weights, true);
  t.add(g.grad_arena, "parameter gradients", BufferKind::gradients, true);
  t.add(g.state_arena, "BN running statistics", BufferKind::weights, true);
  t.add(g.param_half, "16-bit weights", BufferKind::weights, true);
  t.add(g.grad_half, "16-bit weight gradients", BufferKind::gradients, true);
  t.add(g.scaler, "loss scaler", BufferKind::io, true);
  t.add(g.opt_state[0], "optimizer state", BufferKind::optimizer_state, true);
  t.add(g.opt_state[1], "optimizer state 2", BufferKind::optimizer_state, true);
  t.add(g.labels, "labels", BufferKind::io, true);
  t.add(g.losses, "loss terms", BufferKind::io, true);
  const bool keep_all = g.cfg.sharing != BufferSharing::by_liveness;
  for (std::size_t i = 0; i < g.values.size(); ++i) {
    Value& v = g.values[i];
    if (v.root >= 0) continue;
    const auto id = static_cast<ValueId>(i);
    bool io = id == g.input;
    for (const auto& [name, out] : g.outputs) io = io || out == id;
    const std::size_t bytes = g.desc(v.shape).bytes();
    v.data.size = v.stored ? bytes : 0;  // a fused unit's output that is not stored: no buffer at all
    v.grad.size = v.needs_grad ? bytes : 0;
    const std::string name = value_name(g, labels, id);
    const bool keep = keep_all || g.kept[i];
    if (v.stored) t.add(v.data, name, io ? BufferKind::io : BufferKind::activations, io || keep);
    if (v.needs_grad) t.add(v.grad, "grad of " + name, BufferKind::activation_gradients, keep);
  }
}

// One pass of the schedule: its steps, and the first and last step of every buffer it touches.
class Pass {
 public:
  Pass(Graph::Impl& g, Table& t, const std::vector<std::string>& labels, bool training)
      : g_(g), t_(t), labels_(labels), training_(training) {}

  void run() {
    const MemoryPhase fwd = training_ ? MemoryPhase::training_forward : MemoryPhase::forward_only;
    if (g_.mixed()) step(fwd, -1, "weight_cast");
    std::vector<std::vector<Uses::Piece>> backward(g_.layers.size());
    for (std::size_t i = 0; i < g_.layers.size(); ++i) {
      Layer& l = *g_.layers[i];
      if (l.training_only && !training_) continue;
      Uses u(g_, static_cast<int>(i), labels_[i], training_);
      l.declare(u, training_);
      for (const auto& [slot, what] : u.names())
        if (!t_.index.count(slot))
          t_.add(*const_cast<Slot*>(slot), labels_[i] + " " + what, BufferKind::activations,
                 g_.cfg.sharing == BufferSharing::none);
      for (const auto& p : u.pieces()) {
        if (p.backward) {
          backward[i].push_back(p);
          continue;
        }
        const int s = step(fwd, static_cast<int>(i), p.part);
        for (const auto& [slot, a] : p.uses) touch(s, slot, a);
      }
    }
    if (!training_) return close();
    backward_start_ = static_cast<int>(g_.mem.steps.size());
    std::vector<Slot*> zeroed;
    for (auto& v : g_.values)
      if (v.grad_zero_first && v.root < 0 && v.needs_grad) zeroed.push_back(&v.grad);
    if (!zeroed.empty()) {  // as Graph::backward: one piece before the layers
      const int s = step(MemoryPhase::backward, -1, "grad_zero");
      for (Slot* z : zeroed) touch(s, z, Access::write);
    }
    const auto remake = recomputable();
    for (std::size_t i = g_.layers.size(); i-- > 0;) {
      recompute_before(i, backward[i], remake);
      for (const auto& p : backward[i]) {
        const int s = step(MemoryPhase::backward, static_cast<int>(i), p.part);
        for (const auto& [slot, a] : p.uses) touch(s, slot, a);
      }
    }
    step(MemoryPhase::update, -1, "update");
    close();
  }
  int backward_start() const { return backward_start_; }

 private:
  // GraphConfig::recompute: the buffers backward may make again, each with the layers that make it
  // (a value, or a concat whose every part comes from a layer that can), in execution order. Not a
  // buffer that lives for the whole step anyway (kept, io, sharing other than by liveness).
  std::map<int, std::vector<int>> recomputable() const {
    std::map<int, std::vector<int>> r;
    if (!training_ || !recomputes(g_.cfg.recompute, g_.be.kind()) || g_.cfg.sharing != BufferSharing::by_liveness)
      return r;
    std::vector<std::vector<int>> makers(g_.values.size());
    std::vector<bool> can(g_.values.size(), true);
    for (std::size_t v = 0; v < g_.values.size(); ++v) {
      const Value& val = g_.values[v];
      const auto root = static_cast<std::size_t>(g_.root_id(static_cast<ValueId>(v)));
      if (val.producer == -2) continue;  // a concat, made by its parts
      if (val.producer < 0 || !g_.layers[static_cast<std::size_t>(val.producer)]->recomputes_output())
        can[root] = false;
      else
        makers[root].push_back(val.producer);
    }
    for (std::size_t v = 0; v < g_.values.size(); ++v) {
      if (g_.values[v].root >= 0 || !g_.values[v].stored || !can[v] || makers[v].empty()) continue;
      const int b = t_.index.at(&g_.values[v].data);
      if (g_.mem.buffers[static_cast<std::size_t>(b)].persistent) continue;
      std::sort(makers[v].begin(), makers[v].end());
      r[b] = makers[v];
    }
    return r;
  }
  // Before layer i's backward: the recompute pieces of every buffer it reads that backward makes
  // again and no earlier piece of backward has read. The buffer's forward lifetime ends at its last
  // forward reader; a second one starts at the recompute.
  void recompute_before(std::size_t i, const std::vector<Uses::Piece>& pieces,
                        const std::map<int, std::vector<int>>& remake) {
    if (remake.empty()) return;
    for (const auto& p : pieces)
      for (const auto& [slot, a] : p.uses) {
        if (a != Access::read && a != Access::update) continue;
        const auto idx = t_.index.find(slot);
        if (idx == t_.index.end()) continue;
        const int b = idx->second;
        const auto r = remake.find(b);
        if (r == remake.end() || remade_.count(b) || !span_.count(b)) continue;
        remade_.insert(b);
        closed_[b].push_back(span_[b]);
        span_.erase(b);
        g_.mem.buffers[static_cast<std::size_t>(b)].recomputed = true;
        for (const int j : r->second) {
          Uses u(g_, j, labels_[static_cast<std::size_t>(j)], true);
          g_.layers[static_cast<std::size_t>(j)]->declare_recompute(u);
          for (const auto& q : u.pieces()) {
            const int s = step(MemoryPhase::backward, j, q.part);
            for (const auto& [sl, acc] : q.uses) touch(s, sl, acc);
          }
          g_.recompute_before[i].push_back(j);
        }
      }
  }
  int step(MemoryPhase ph, int layer, const char* part) {
    g_.mem.steps.push_back({ph, layer, part, layer >= 0 ? labels_[static_cast<std::size_t>(layer)] : ""});
    return static_cast<int>(g_.mem.steps.size()) - 1;
  }
  void touch(int s, Slot* slot, Access a) {
    auto it = t_.index.find(slot);
    SB_CHECK(it != t_.index.end(), "planning: a declared buffer was never registered");
    const int b = it->second;
    PlannedBuffer& buf = g_.mem.buffers[static_cast<std::size_t>(b)];
    const PlanStep& st = g_.mem.steps[static_cast<std::size_t>(s)];
    if (st.phase == MemoryPhase::training_forward || st.phase == MemoryPhase::forward_only)
      t_.forward_touched[static_cast<std::size_t>(b)] = true;
    if (buf.persistent) return;
    if (a == Access::scratch) {
      t_.scratch[static_cast<std::size_t>(b)] = true;
      auto& pts = points_[b];
      if (!pts.empty() && pts.back().last + 1 >= s)
        pts.back().last = s;
      else
        pts.push_back({s, s});
      return;
    }
    if (!span_.count(b)) {
      if (a != Access::write)
        throw Error(fmt::format(
            "planning: {} {} reads '{}' before anything wrote it in the {}; declare the piece that writes it "
            "(Layer::declare)",
            st.label.empty() ? "the graph's" : st.label, st.part, buf.name,
            training_ ? "training step" : "inference forward"));
      span_[b] = {s, s};
    }
    span_[b].last = s;
  }
  void close() {
    for (const auto& [b, i] : span_) {
      SB_CHECK(!points_.count(b), fmt::format("planning: '{}' is declared both as scratch and not",
                                              g_.mem.buffers[static_cast<std::size_t>(b)].name));
      auto& live = g_.mem.buffers[static_cast<std::size_t>(b)].live;
      if (closed_.count(b)) live.insert(live.end(), closed_[b].begin(), closed_[b].end());
      live.push_back(i);
    }
    for (const auto& [b, pts] : points_) {
      auto& live = g_.mem.buffers[static_cast<std::size_t>(b)].live;
      live.insert(live.end(), pts.begin(), pts.end());
    }
  }

  Graph::Impl& g_;
  Table& t_;
  const std::vector<std::string>& labels_;
  bool training_;
  int backward_start_ = -1;
  std::map<int, LiveInterval> span_;
  std::map<int, std::vector<LiveInterval>> closed_;  // lifetimes that ended before a recompute
  std::set<int> remade_;
  std::map<int, std::vector<LiveInterval>> points_;
};

// What each layer's own buffer holds: workspace, something of the forward (saved when the training
// step keeps it into the backward, as values are), or a gradient of the backward.
void classify(Graph::Impl& g, const Table& t, int backward_start) {
  for (std::size_t i = 0; i < g.mem.buffers.size(); ++i) {
    PlannedBuffer& b = g.mem.buffers[i];
    if (b.persistent || b.kind != BufferKind::activations) continue;
    if (t.scratch[i]) {
      b.kind = BufferKind::workspace;
    } else if (!t.forward_touched[i]) {
      b.kind = BufferKind::activation_gradients;
    } else {
      for (const auto& iv : b.live)
        if (iv.first < backward_start && iv.last >= backward_start) b.kind = BufferKind::saved;
    }
  }
}

}  // namespace

void plan_lifetimes(Graph::Impl& g) {
  g.mem = MemoryPlan{};
  g.mem_slots.clear();
  g.recompute_before.assign(g.layers.size(), {});
  g.kept.resize(g.values.size(), false);
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < g.layers.size(); ++i) labels.push_back(layer_label(*g.layers[i], i));
  Table t{g, {}, {}, {}};
  register_graph_buffers(g, t, labels);
  Pass(g, t, labels, false).run();
  Pass training(g, t, labels, true);
  training.run();
  classify(g, t, training.backward_start());
  refresh_sizes(g);
}

void refresh_sizes(Graph::Impl& g) {
  for (std::size_t i = 0; i < g.mem.buffers.size(); ++i) g.mem.buffers[i].bytes = aligned(g.mem_slots[i]->size);
}

}  // namespace stepbench
