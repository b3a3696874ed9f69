// The optimizer's state as a run starts it: momentum buffers at 0, RMSProp's mean square at 1 (as
// TensorFlow's RMSPropOptimizer, which the Inception recipe uses) and its momentum at 0, whether the
// state is allocated here or lives in a graph's arena that held something else. The op test
// (tests/backend/optimizer_test.cpp) starts from random state and so cannot see the start.
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "backend/registry.hpp"
#include "support/test_util.hpp"
#include "train/trainer.hpp"

namespace stepbench {
namespace {

TEST(OptimizerState, StartsWhereTensorFlowAndPyTorchStart) {
  auto be = make_cpu_backend();
  const std::size_t n = 256;
  for (auto kind : {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::rmsprop}) {
    for (bool own : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, state {}", to_string(kind), own ? "allocated" : "in buffers given"));
      OptimizerConfig cfg;
      cfg.kind = kind;
      cfg.lr = 0.05f;
      cfg.weight_decay = 1e-3f;
      auto p = test::random_vec(n, 30);
      test::DevVec P(*be, p), A(*be, test::random_vec(n, 31, 2, 3)), B(*be, test::random_vec(n, 32, 2, 3));
      OptimizerState state(*be, cfg, n, own ? std::vector<float*>{} : std::vector<float*>{A, B});
      // the reference's state as TensorFlow (RMSProp) and PyTorch (momentum) start it
      ref::Vec s0(n, kind == OptimizerKind::rmsprop ? 1.0 : 0.0), s1(n, 0.0);
      const auto p0 = p;
      for (int step = 0; step < 2; ++step) {
        const auto g = test::random_vec(n, 33 + step);
        test::DevVec G(*be, g);
        state.update(be->default_stream(), P, G);
        ref::optimizer_update(cfg, p, g, s0, s1);
      }
      be->synchronize(be->default_stream());
      // a few fp32 roundings per step of terms no larger than these; a mean square started at 0
      // instead of 1 moves RMSProp's steps by about 30%, a momentum buffer that is not zeroed by its
      // old contents (2 to 3) times lr
      const double u = 0x1p-24;
      ref::Vec bound(n);
      for (std::size_t i = 0; i < n; ++i) bound[i] = 32 * u * (std::abs(p[i]) + std::abs(p0[i]) + 1);
      EXPECT_WITHIN(P.get_host(), p, bound);
    }
  }
}

}  // namespace
}  // namespace stepbench
