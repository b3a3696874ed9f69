#include "train/trainer.hpp"

#include <fmt/format.h>

#include "tensor/error.hpp"

namespace stepbench {

OptimizerState::OptimizerState(Backend& be, OptimizerConfig cfg, std::size_t n, std::vector<float*> in)
    : be_(be), cfg_(cfg), count_(n) {
  auto& s = be.default_stream();
  const auto k = static_cast<std::size_t>(optimizer_state_arenas(cfg.kind));
  SB_CHECK(in.empty() || in.size() >= k, fmt::format("{} optimizer state buffers for {}", in.size(), k));
  if (k > 0) {
    if (in.empty()) s0_ = Buffer(be, n * sizeof(float));
    p0_ = in.empty() ? s0_.as<float>() : in[0];
    // RMSProp's mean square starts at 1, as TensorFlow's RMSPropOptimizer; momentum buffers at 0.
    be.fill(s, p0_, cfg.kind == OptimizerKind::rmsprop ? 1.0f : 0.0f, n);
  }
  if (k > 1) {
    if (in.empty()) s1_ = Buffer(be, n * sizeof(float));
    p1_ = in.empty() ? s1_.as<float>() : in[1];
    be.memset_zero(s, p1_, n * sizeof(float));
  }
  be.synchronize(s);
}

void OptimizerState::update(Stream& s, float* params, const float* grads, const float* scaler) {
  be_.optimizer_update(s, cfg_, params, grads, p0_, p1_, count_, scaler);
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

// The graph's arena holds the state when it was planned with room for it.
std::vector<float*> state_in(const Graph& g, OptimizerKind k) {
  std::vector<float*> v;
  if (g.config().optimizer_state_arenas >= optimizer_state_arenas(k))
    for (int i = 0; i < optimizer_state_arenas(k); ++i) v.push_back(g.optimizer_state(i));
  return v;
}
}  // namespace

Trainer::Trainer(Graph& g, OptimizerConfig cfg)
    : g_(planned(g)), opt_(g.backend(), cfg, g.param_arena_floats(), state_in(g, cfg.kind)) {}

}  // namespace stepbench
