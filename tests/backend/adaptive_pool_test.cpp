// Adaptive average pooling (AdaptiveAvgPoolOp) against the oracle: PyTorch's windows where the
// output is smaller (overlapping where the sizes do not divide), equal (VGG's 7 x 7 at 224) and
// larger (repeating: VGG's classifier at a small image size) than the input; backward overwritten and
// accumulated.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

// A mean of K stored values: fp32 sum and division, then the storage type's rounding.
test::Vec mean_bound(const test::ErrorModel& m, const Shape& xs, const test::Vec& x, const Shape& ys,
                     const test::Vec& y) {
  test::Vec ax = test::absv(x), mean_abs;
  ref::adaptive_avg_pool_forward(xs, ax, ys, mean_abs);
  const std::int64_t k = (xs.h + ys.h - 1) / ys.h + 1, kw = (xs.w + ys.w - 1) / ys.w + 1;  // the largest window
  return test::plus_rounding(test::axpby(m.sum(k * kw) + m.u_acc, mean_abs, 0, {}), y, m.u_out);
}

TEST_P(Ops, AdaptiveAveragePoolingMatchesPyTorchsWindows) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  auto& st = be->default_stream();
  struct Case {
    Shape x;
    std::int64_t oh, ow;
  };
  for (const Case& c :
       {Case{{2, 3, 13, 13}, 6, 6}, Case{{2, 4, 7, 7}, 7, 7}, Case{{2, 3, 3, 2}, 7, 7}, Case{{1, 5, 10, 5}, 4, 3}})
    for (const bool sliced : {true, false}) {
      const Shape ys{c.x.n, c.x.c, c.oh, c.ow};
      SCOPED_TRACE(fmt::format("{} -> {}x{}{}", to_string(c.x), c.oh, c.ow, sliced ? ", sliced" : ""));
      const auto x = test::round_to(dtype, random_vec(c.x.numel(), 40));
      const auto dy = test::round_to(dtype, random_vec(ys.numel(), 41));
      const auto acc = test::round_to(dtype, random_vec(c.x.numel(), 42));
      ref::Vec y_ref, dx_ref;
      ref::adaptive_avg_pool_forward(c.x, x, ys, y_ref);
      ref::adaptive_avg_pool_backward(c.x, ys, dy, dx_ref);
      const std::int64_t before = sliced ? 2 : 0;
      DevTensor X(*be, c.x, layout, dtype, before, 1), Y(*be, ys, layout, dtype, 0, before),
          DY(*be, ys, layout, dtype, before, 0), DX(*be, c.x, layout, dtype, 0, before);
      X.upload(x);
      DY.upload(dy);
      auto op = be->make_adaptive_avg_pool(X.t().desc, Y.t().desc);
      op->forward(st, X, Y);
      EXPECT_WITHIN(Y.download(), y_ref, mean_bound(m, c.x, x, ys, y_ref));
      // each input gathers dy / window size from the windows covering it: at most a few terms
      ref::Vec edx;
      ref::adaptive_avg_pool_backward(c.x, ys, test::absv(dy), edx);
      const double u = m.sum(16) + m.u_acc;
      op->backward(st, DY, DX, 0.0f);
      EXPECT_WITHIN(DX.download(), dx_ref, test::plus_rounding(test::axpby(u, edx, 0, {}), dx_ref, m.u_out));
      DX.upload(acc);
      op->backward(st, DY, DX, 1.0f);
      ref::Vec sum(dx_ref.size()), esum(dx_ref.size());
      for (std::size_t i = 0; i < sum.size(); ++i)
        sum[i] = dx_ref[i] + acc[i], esum[i] = u * edx[i] + m.u_acc * std::abs(sum[i]);
      EXPECT_WITHIN(DX.download(), sum, test::plus_rounding(esum, sum, m.u_out));
    }
}

}  // namespace
}  // namespace stepbench
