// The interface every layer kind implements (one file per kind in this folder). Graph's builder
// call for a kind creates its layer; declare() says which buffers each piece of its forward and
// backward touches (planning derives every buffer's lifetime from it: graph/liveness.hpp); plan()
// sizes its own buffers and creates its backend ops; forward() and backward() only launch work on
// them. Internal to the graph.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.hpp"

namespace stepbench {

class Uses;              // graph/liveness.hpp
struct ConvBnReluLayer;  // graph/layers/conv_bn_relu.hpp

struct Layer {
  virtual ~Layer() = default;
  std::vector<ValueId> in;
  ValueId out = -1;
  bool training_only = false;
  std::string label;                   // LayerInfo::label as the builder gave it ("" to derive)
  std::vector<float> in_beta;          // per input: 0 overwrites its gradient, 1 accumulates
  std::vector<std::size_t> trainable;  // indices of the parameters whose gradients this layer writes
  std::size_t ready_after = 0;         // gradient-arena prefix (floats) final once this layer's backward ran
  // Fusion (GraphConfig::fuse, graph/fuse.cpp): per input, the unit whose output it is when that
  // output is not stored (the layer then reads the unit's z and applies its batch norm on load), or
  // null. Set before declare() and plan(); empty when nothing is fused.
  std::vector<ConvBnReluLayer*> in_unit;
  ConvBnReluLayer* unit_at(std::size_t k) const { return k < in_unit.size() ? in_unit[k] : nullptr; }
  // Whether input k may be a unit's output applied on load: relu, whether that unit has a ReLU.
  virtual bool loads_normalised(std::size_t k, bool relu) const {
    (void)k, (void)relu;
    return false;
  }
  // The pieces of work of one pass (training: the training forward and the backward; otherwise the
  // inference forward) in the order they run, each with every buffer it reads or writes: the values,
  // their gradients and the layer's own slots (graph/liveness.hpp, Uses). Called before plan(), so
  // it must not depend on the ops.
  virtual void declare(Uses& u, bool training) = 0;
  // Creates the backend ops and sizes the slots whose size they decide (workspace, reserves).
  virtual void plan(Graph::Impl&) = 0;
  virtual void forward(Graph::Impl&, Stream&, bool training) = 0;
  virtual void backward(Graph::Impl&, Stream&) = 0;
  // Recomputation (GraphConfig::recompute): whether backward can make this layer's output again from
  // what the layer keeps for its own backward anyway (conv_bn_relu: z and the batch statistics), so
  // that the output need not live from the forward into the backward. Planning then frees it after
  // its last forward reader and runs recompute() before the first backward piece that reads it;
  // declare_recompute() declares that piece (Uses::backward, named as its ProbeScope).
  virtual bool recomputes_output() const { return false; }
  virtual void declare_recompute(Uses&) {}
  virtual void recompute(Graph::Impl&, Stream&) {}
  // true: forward() and backward() open their own ProbeScopes, one per piece (conv_bn_relu);
  // otherwise the graph opens one around each call ("fwd", "bwd").
  virtual bool probes_itself() const { return false; }
  virtual void check_after_sync() {}               // errors the device flagged during the step (bad labels)
  virtual std::int64_t macs() const { return 0; }  // whole batch
  virtual LayerInfo info() const = 0;
  LayerInfo base_info(std::string kind, std::string name = {}) const {
    LayerInfo i;
    i.kind = std::move(kind);
    i.name = std::move(name);
    i.label = label.empty() ? i.name : label;
    i.in = in;
    i.out = out;
    i.training_only = training_only;
    i.ready_after = ready_after;
    i.macs = macs();
    return i;
  }
};

}  // namespace stepbench
