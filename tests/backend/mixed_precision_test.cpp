// Mixed precision: the cast to and from the configuration's type, and dynamic loss scaling.
#include <cmath>
#include <limits>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

// Mixed precision and dynamic loss scaling: the cast to and from this configuration's type, the
// overflow check, the scale's update and the optimizer that divides the scale out or skips.
TEST_P(Ops, CastAndLossScaling) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  auto& s = be->default_stream();
  const auto v = random_vec(1000, 23, -300, 300);
  std::vector<float> f(v.begin(), v.end());
  Buffer a(*be, f.size() * 4), h(*be, f.size() * dtype_size(dtype)), b(*be, f.size() * 4);
  be->copy(s, a.get(), f.data(), a.bytes());
  be->cast(s, a.get(), DType::f32, h.get(), dtype, f.size());
  be->cast(s, h.get(), dtype, b.get(), DType::f32, f.size());
  std::vector<float> back(f.size()), want(f.size());
  be->copy(s, back.data(), b.get(), b.bytes());
  be->synchronize(s);
  std::vector<char> narrow(h.bytes());
  convert(f.data(), DType::f32, narrow.data(), dtype, f.size());  // the host rounding: nearest even
  convert(narrow.data(), dtype, want.data(), DType::f32, f.size());
  EXPECT_EQ(back, want);

  DevVec scaler(*be, std::vector<double>{1024.0, 0.0, 0.0});
  DevVec finite(*be, std::vector<double>{1.0, -2.0, 3e30});
  be->check_finite(s, finite, 3, scaler);
  be->update_loss_scale(s, scaler, 3);  // no overflow: one good step counted
  EXPECT_EQ(scaler.get_host(), (std::vector<double>{1024.0, 0.0, 1.0}));
  be->update_loss_scale(s, scaler, 3);
  be->update_loss_scale(s, scaler, 3);  // the third good step doubles the scale
  EXPECT_EQ(scaler.get_host(), (std::vector<double>{2048.0, 0.0, 0.0}));
  // an overflow: the update is skipped, the scale halves, found_inf is cleared
  std::vector<double> g = {2048.0, std::numeric_limits<double>::infinity(), 4096.0};
  DevVec G(*be, g), P(*be, std::vector<double>{1.0, 1.0, 1.0});
  be->check_finite(s, G, 3, scaler);
  EXPECT_EQ(scaler.get_host()[1], 1.0);
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::sgd;
  sgd.lr = 0.5f;
  be->optimizer_update(s, sgd, P, G, nullptr, nullptr, 3, scaler);
  EXPECT_EQ(P.get_host(), (std::vector<double>{1.0, 1.0, 1.0}));
  be->update_loss_scale(s, scaler, 3);
  EXPECT_EQ(scaler.get_host(), (std::vector<double>{1024.0, 0.0, 0.0}));
  // finite gradients: divided by the scale (1024) before the step
  G.set({2048.0, -1024.0, 512.0});
  be->check_finite(s, G, 3, scaler);
  be->optimizer_update(s, sgd, P, G, nullptr, nullptr, 3, scaler);
  EXPECT_EQ(P.get_host(), (std::vector<double>{0.0, 1.5, 0.75}));
  std::vector<double> nan_g = {0.0, std::nan(""), 0.0};
  G.set(nan_g);
  be->check_finite(s, G, 3, scaler);
  EXPECT_EQ(scaler.get_host()[1], 1.0);
}

}  // namespace
}  // namespace stepbench
