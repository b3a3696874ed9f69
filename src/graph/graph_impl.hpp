// The graph's internals, shared by the builder and accessors (graph.cpp), planning (plan.cpp,
// liveness.cpp, assign.cpp) and the layer kinds (layers/): values, the slots of the one device
// arena, and Graph::Impl.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.hpp"
#include "graph/layers/layer.hpp"
#include "tensor/error.hpp"

namespace stepbench {

// A piece of the graph's one device arena: sized while planning, given its offset by the plan
// (memory_plan.hpp; buffers whose lifetimes do not overlap may get the same one), placed when the
// arena is allocated at the end of plan(), so a batch that does not fit fails there, before any step.
struct Slot {
  std::size_t offset = 0, size = 0;
  char* base = nullptr;
  void* get() const { return size ? base + offset : nullptr; }
  template <class T>
  T* as() const {
    return static_cast<T*>(get());
  }
  std::size_t bytes() const { return size; }
};

struct Value {
  Shape shape;
  ValueId root = -1;  // concat parent, or -1
  std::int64_t c_offset = 0;
  bool needs_grad = true;
  int producer = -1;  // layer index
  Slot data, grad;    // roots only
  Tensor t, g;        // views, valid after plan()
  bool grad_zero_first = false;
  bool stored = true;  // false: a fused unit's output its readers make on load (graph/fuse.cpp): no buffer
};

struct Graph::Impl {
  Backend& be;
  GraphConfig cfg;
  SlowConvFault slow_conv;  // test-only fault (Graph::set_fault)
  std::vector<Value> values;
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<ParamEntry> params;
  std::map<std::string, std::size_t> param_index;
  std::map<std::string, ValueId> outputs;
  bool training_only = false;
  bool planned = false;
  bool dry_planned = false;  // plan_dry() ran: the graph cannot be planned any more
  ValueId input = -1;
  Slot param_arena, grad_arena, state_arena, labels, losses;
  Slot param_half, grad_half, scaler;  // mixed precision: 16-bit weights and weight gradients; loss scaler
  Slot opt_state[2];                   // GraphConfig::optimizer_state_arenas
  // The arena: every slot above, every value's and every layer's, one allocation, laid out by the
  // plan (mem.buffers[i] is placed into *mem_slots[i]).
  Buffer arena;
  MemoryPlan mem;
  std::vector<Slot*> mem_slots;
  std::size_t arena_bytes = 0;
  std::size_t needed_bytes = 0;  // what the last memory check asked for (Graph::size_plan)
  std::vector<bool> kept;        // per value: Graph::keep
  // per layer: the layers whose output backward recomputes right before it (GraphConfig::recompute;
  // planning decides, liveness.cpp)
  std::vector<std::vector<int>> recompute_before;
  bool trained = false;  // the last forward was a training one (backward may follow)
  std::size_t param_floats = 0, state_floats = 0;
  int num_losses = 0;
  std::vector<float> loss_weights;
  std::uint64_t step = 0;

  GraphProbe* probe = nullptr;  // Graph::set_probe
  int current = -1;             // the layer running, for the probe (-1: the graph's own work)

  Impl(Backend& b, GraphConfig c) : be(b), cfg(c) {}
  std::int32_t* bound_labels = nullptr;  // bind_input(): labels live in the caller's buffer
  void* own_input = nullptr;             // the planned input buffer, for unbinding
  std::int32_t* label_ptr() const { return bound_labels ? bound_labels : labels.as<std::int32_t>(); }

  TensorDesc desc(const Shape& s) const { return TensorDesc::dense(s, cfg.dtype, cfg.layout); }
  // s by value: callers pass another value's shape, which the push_back may move
  ValueId new_value(Shape s, int producer) {
    values.push_back(Value{});
    values.back().shape = s;
    values.back().producer = producer;
    return static_cast<ValueId>(values.size() - 1);
  }
  std::size_t add_param(ParamEntry e) {
    if (param_index.count(e.name)) throw Error(fmt::format("parameter '{}' registered twice", e.name));
    e.count = e.storage ? e.storage->floats() : e.numel();
    param_index[e.name] = params.size();
    params.push_back(std::move(e));
    return params.size() - 1;
  }
  float* pdata(std::size_t i) const {
    const auto& e = params[i];
    return (e.trainable ? param_arena.as<float>() : state_arena.as<float>()) + e.offset;
  }
  float* pgrad(std::size_t i) const { return grad_arena.as<float>() + params[i].offset; }
  bool mixed() const { return is_half(cfg.dtype); }
  // What convolutions and fully connected layers read and write: the fp32 arenas, or the 16-bit ones.
  void* wdata(std::size_t i) const {
    return mixed() ? static_cast<void*>(param_half.as<char>() + 2 * params[i].offset) : pdata(i);
  }
  void* wgrad(std::size_t i) const {
    return mixed() ? static_cast<void*>(grad_half.as<char>() + 2 * params[i].offset) : pgrad(i);
  }
  // After a layer wrote the 16-bit gradient of parameter i: into the fp32 gradient arena.
  void widen_grad(Stream& s, std::size_t i) const {
    if (mixed()) be.cast(s, wgrad(i), cfg.dtype, pgrad(i), DType::f32, params[i].count);
  }
  const float* loss_scale_ptr() const { return scaler.size ? scaler.as<float>() : nullptr; }
  const Value& root_of(ValueId v) const { return values[v].root >= 0 ? values[values[v].root] : values[v]; }
  ValueId root_id(ValueId v) const { return values[v].root >= 0 ? values[v].root : v; }
  Layer& add_layer(std::unique_ptr<Layer> l) {
    if (planned) throw Error("graph: layers cannot be added after plan()");
    l->training_only = training_only;
    layers.push_back(std::move(l));
    return *layers.back();
  }
  // forward() and backward() (graph.cpp), with a call after each layer's work was launched (the
  // health check reads its output, or the gradients it passed back, while they are live).
  void run_forward(Stream& s, bool training, const std::function<void(std::size_t)>& after_layer = {});
  void run_backward(Stream& s, const std::function<void(std::size_t)>& on_ready,
                    const std::function<void(std::size_t)>& after_layer = {});
};

// GraphConfig::fuse (fuse.cpp): which conv + BN units run fused and which outputs are not stored
// (Value::stored, ConvBnReluLayer::fused and ::stored, Layer::in_unit). Before the rest of planning.
void mark_fused_units(Graph::Impl& g);

// One piece of work for the probe, if one is attached: begin() now, end() when it goes out of scope.
class ProbeScope {
 public:
  ProbeScope(const Graph::Impl& g, Stream& s, const char* part)
      : p_(g.probe), s_(s), unwinding_(std::uncaught_exceptions()) {
    if (p_) p_->begin(s_, g.current, part);
  }
  // Not while an exception from the piece unwinds (recording on a failed device would throw again).
  // A destructor must not throw: an error of end() (a sticky CUDA error) is left to the next call
  // to the device, which reports it.
  ~ProbeScope() {
    if (!p_ || std::uncaught_exceptions() > unwinding_) return;
    try {
      p_->end(s_);
    } catch (...) {
    }
  }
  ProbeScope(const ProbeScope&) = delete;
  ProbeScope& operator=(const ProbeScope&) = delete;

 private:
  GraphProbe* p_;
  Stream& s_;
  int unwinding_;
};

}  // namespace stepbench
