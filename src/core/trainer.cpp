#include "stepbench/trainer.hpp"

#include <vector>

#include "stepbench/error.hpp"

namespace stepbench {

Trainer::Trainer(Graph& g, OptimizerConfig cfg) : g_(g), cfg_(cfg) {
  SB_CHECK(g.planned(), "plan the graph before making a trainer");
  Backend& be = g.backend();
  const std::size_t n = g.param_arena_floats();
  auto& s = be.default_stream();
  if (cfg.kind != OptimizerKind::sgd) {
    s0_ = Buffer(be, n * sizeof(float));
    // RMSProp's mean square starts at 1, as TensorFlow's RMSPropOptimizer; momentum buffers at 0.
    be.fill(s, s0_.as<float>(), cfg.kind == OptimizerKind::rmsprop ? 1.0f : 0.0f, n);
  }
  if (cfg.kind == OptimizerKind::rmsprop) {
    s1_ = Buffer(be, n * sizeof(float));
    be.memset_zero(s, s1_.get(), n * sizeof(float));
  }
  be.synchronize(s);
}

void Trainer::update(Stream& s) {
  g_.backend().optimizer_update(s, cfg_, g_.param_arena(), g_.grad_arena(), s0_.as<float>(), s1_.as<float>(),
                                g_.param_arena_floats());
}

}  // namespace stepbench
