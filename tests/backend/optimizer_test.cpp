// The optimizer updates (SGD, momentum, RMSProp) over several steps against the oracle's.
#include <cmath>
#include <string>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

TEST_P(Ops, OptimizerUpdates) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  for (auto kind : {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::rmsprop}) {
    SCOPED_TRACE(std::string(to_string(kind)));
    OptimizerConfig cfg;
    cfg.kind = kind;
    cfg.lr = 0.05f;
    cfg.weight_decay = 1e-3f;
    const std::size_t n = 1000;
    auto p = random_vec(n, 20), s0 = random_vec(n, 21, 0, 1), s1 = random_vec(n, 22);
    const auto p0 = p, s00 = s0;
    DevVec P(*be, p), S0(*be, s0), S1(*be, s1);
    const int steps = 3;
    for (int step = 0; step < steps; ++step) {
      const auto g = random_vec(n, 23 + step);
      DevVec G(*be, g);
      be->optimizer_update(be->default_stream(), cfg, P, G, S0, S1, n, nullptr);
      ref::optimizer_update(cfg, p, g, s0, s1);
    }
    // a handful (at most 8) of fp32 roundings per step, each of a term no larger than the values
    // the step combines
    const double u = test::error_model(GetParam()).u_acc;
    ref::Vec ep(n), es0(n);
    for (std::size_t i = 0; i < n; ++i) {
      ep[i] = 8 * steps * u * (std::abs(p[i]) + std::abs(p0[i]) + std::abs(s0[i]) + std::abs(s1[i]));
      es0[i] = 8 * steps * u * (std::abs(s0[i]) + std::abs(s00[i]) + 1);
    }
    EXPECT_WITHIN(P.get_host(), p, ep);
    if (kind != OptimizerKind::sgd) {
      EXPECT_WITHIN(S0.get_host(), s0, es0);
    }
  }
}

}  // namespace
}  // namespace stepbench
