// One training step on one graph: forward (training mode), loss, backward, optimizer update over
// the whole parameter arena. The phases are separate calls so benchmarks can time each one.
#pragma once
#include <vector>

#include "graph/graph.hpp"

namespace stepbench {

// The optimizer's state over a flat parameter arena (momentum buffer; RMSProp's mean square and
// momentum) in one backend's memory, and the update that uses it.
class OptimizerState {
 public:
  // in: optimizer_state_arenas(cfg.kind) buffers of `count` floats someone else owns (a graph's
  // arena, GraphConfig::optimizer_state_arenas); empty: allocated here.
  OptimizerState(Backend& be, OptimizerConfig cfg, std::size_t count, std::vector<float*> in = {});
  // scaler: a LossScaler in the backend's memory, or nullptr
  void update(Stream& s, float* params, const float* grads, const float* scaler = nullptr);
  const OptimizerConfig& config() const { return cfg_; }

 private:
  Backend& be_;
  OptimizerConfig cfg_;
  std::size_t count_;
  Buffer s0_, s1_;
  float *p0_ = nullptr, *p1_ = nullptr;
};

class Trainer {
 public:
  Trainer(Graph& g, OptimizerConfig cfg);
  void forward(Stream& s) { g_.forward(s, true); }
  void backward(Stream& s) { g_.backward(s); }
  // With loss scaling: checks the (synchronised) gradients for overflow, updates with the scale
  // divided out (or skips the update), then adjusts the scale.
  void update(Stream& s);
  void step(Stream& s) {
    forward(s);
    backward(s);
    update(s);
  }
  const OptimizerConfig& config() const { return opt_.config(); }
  Graph& graph() { return g_; }

 private:
  Graph& g_;
  OptimizerState opt_;
};

}  // namespace stepbench
