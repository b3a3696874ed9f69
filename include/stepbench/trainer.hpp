// One training step on one graph: forward (training mode), loss, backward, optimizer update over
// the whole parameter arena. The phases are separate calls so benchmarks can time each one.
#pragma once
#include "stepbench/graph.hpp"

namespace stepbench {

class Trainer {
 public:
  Trainer(Graph& g, OptimizerConfig cfg);
  void forward(Stream& s) { g_.forward(s, true); }
  void backward(Stream& s) { g_.backward(s); }
  void update(Stream& s);
  void step(Stream& s) {
    forward(s);
    backward(s);
    update(s);
  }
  const OptimizerConfig& config() const { return cfg_; }
  Graph& graph() { return g_; }

 private:
  Graph& g_;
  OptimizerConfig cfg_;
  Buffer s0_, s1_;  // optimizer state over the arena
};

}  // namespace stepbench
