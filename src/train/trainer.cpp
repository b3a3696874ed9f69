#include "train/trainer.hpp"

#include "tensor/error.hpp"

namespace stepbench {

OptimizerState::OptimizerState(Backend& be, OptimizerConfig cfg, std::size_t n) : be_(be), cfg_(cfg), count_(n) {
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

void OptimizerState::update(Stream& s, float* params, const float* grads, const float* scaler) {
  be_.optimizer_update(s, cfg_, params, grads, s0_.as<float>(), s1_.as<float>(), count_, scaler);
}

void Trainer::update(Stream& s) {
  Backend& be = g_.backend();
  float* scaler = g_.loss_scaler();
  if (scaler) be.check_finite(s, g_.grad_arena(), g_.param_arena_floats(), scaler);
  opt_.update(s, g_.param_arena(), g_.grad_arena(), scaler);
  if (scaler) be.update_loss_scale(s, scaler, LossScaler::kGrowthInterval);
}

namespace {
Graph& planned(Graph& g) {
  SB_CHECK(g.planned(), "plan the graph before making a trainer");
  return g;
}
}  // namespace

Trainer::Trainer(Graph& g, OptimizerConfig cfg) : g_(planned(g)), opt_(g.backend(), cfg, g.param_arena_floats()) {}

}  // namespace stepbench
