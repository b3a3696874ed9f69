// The elementwise ops: ReLU forward and backward with accumulation, the fan-out add, dropout.
#include <algorithm>
#include <cmath>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

TEST_P(Ops, ReluAndAccumulate) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const Shape s{2, 3, 4, 5};
  const auto m = test::error_model(GetParam());
  const auto x = test::round_to(dtype, random_vec(s.numel(), 10)),
             dy = test::round_to(dtype, random_vec(s.numel(), 11)),
             acc = test::round_to(dtype, random_vec(s.numel(), 12));
  DevTensor X(*be, s, layout, dtype), Y(*be, s, layout, dtype, 1, 0), DY(*be, s, layout, dtype),
      DX(*be, s, layout, dtype, 0, 2);
  X.upload(x);
  DY.upload(dy);
  auto op = be->make_relu(X.t().desc, Y.t().desc, kNoClip);
  auto& st = be->default_stream();
  op->forward(st, X, Y);
  ref::Vec y_ref(x.size()), dx_ref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    y_ref[i] = std::max(x[i], 0.0);
    dx_ref[i] = x[i] > 0 ? dy[i] + acc[i] : acc[i];
  }
  EXPECT_EQ(Y.download(), y_ref);  // exact: a copy or zero
  DX.upload(acc);
  op->backward(st, Y, DY, DX, 1.0f);
  // one addition in fp32, rounded to the storage type
  EXPECT_WITHIN(DX.download(), dx_ref,
                test::plus_rounding(test::axpby(m.u_acc, test::absv(dx_ref), 0, {}), dx_ref, m.u_out));
  // fan-out accumulation: dst = src + dst
  DX.upload(acc);
  be->add(st, DY, DX, 1.0f);
  ref::Vec sum(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) sum[i] = dy[i] + acc[i];
  EXPECT_WITHIN(DX.download(), sum, test::plus_rounding(test::axpby(m.u_acc, test::absv(sum), 0, {}), sum, m.u_out));
}

// ReLU6 (MobileNet-v2): clipped at 6 forward; backward passes dy only where 0 < y < 6.
TEST_P(Ops, Relu6ClipsAtSixBothWays) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const Shape s{2, 7, 4, 5};
  auto x = random_vec(s.numel(), 13);
  for (double& v : x) v *= 12;  // about a third beyond 6
  x = test::round_to(dtype, x);
  x[3] = 6.0;  // exactly at the clip: no gradient, as PyTorch's hardtanh
  const auto dy = test::round_to(dtype, random_vec(s.numel(), 14));
  DevTensor X(*be, s, layout, dtype, 0, 1), Y(*be, s, layout, dtype, 2, 0), DY(*be, s, layout, dtype),
      DX(*be, s, layout, dtype, 1, 1);
  X.upload(x);
  DY.upload(dy);
  auto op = be->make_relu(X.t().desc, Y.t().desc, 6.0f);
  auto& st = be->default_stream();
  op->forward(st, X, Y);
  ref::Vec y_ref(x.size()), dx_ref(x.size());
  std::size_t clipped = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    y_ref[i] = std::min(std::max(x[i], 0.0), 6.0);
    dx_ref[i] = x[i] > 0 && x[i] < 6 ? dy[i] : 0.0;
    clipped += x[i] >= 6;
  }
  ASSERT_GT(clipped, x.size() / 8) << "the data must reach the clip";
  EXPECT_EQ(Y.download(), y_ref);  // exact: a copy, zero or six
  op->backward(st, Y, DY, DX, 0.0f);
  EXPECT_EQ(DX.download(), dx_ref);
  // accumulated: one addition, rounded to the storage type
  const auto acc = test::round_to(dtype, random_vec(s.numel(), 15));
  DX.upload(acc);
  op->backward(st, Y, DY, DX, 1.0f);
  ref::Vec sum(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) sum[i] = dx_ref[i] + acc[i];
  const auto m = test::error_model(GetParam());
  EXPECT_WITHIN(DX.download(), sum, test::plus_rounding(test::axpby(m.u_acc, test::absv(sum), 0, {}), sum, m.u_out));
}

TEST_P(Ops, Dropout) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const Shape s{16, 512, 1, 1};
  const double p = 0.5;
  const auto x = random_vec(s.numel(), 17, 0.5, 1.5), dy = random_vec(s.numel(), 18);
  DevTensor X(*be, s, layout, dtype), Y(*be, s, layout, dtype), Y2(*be, s, layout, dtype), DY(*be, s, layout, dtype),
      DX(*be, s, layout, dtype);
  X.upload(x);
  DY.upload(dy);
  auto op = be->make_dropout(X.t().desc, p);
  Buffer mask(*be, op->reserve_bytes());
  auto& st = be->default_stream();
  op->forward(st, X, Y, mask.get(), 42, 0);
  const auto y = Y.download();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (y[i] != 0) {
      ++kept;
      // x is rounded to the storage type on upload, the scaling by 1 / (1 - p) = 2 is exact, the
      // result is stored in the type
      EXPECT_NEAR(y[i], x[i] / (1 - p), 2 * test::unit_roundoff(dtype) * std::abs(x[i] / (1 - p)));
    }
  }
  // 8192 Bernoulli(0.5) draws: mean 4096, sd 45; 5 sd is a generous bound
  EXPECT_NEAR(static_cast<double>(kept), 4096.0, 225.0);
  op->backward(st, DY, DX, 0.0f, mask.get());
  const auto dx = DX.download();
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_EQ(dx[i] != 0, y[i] != 0) << i;
  // same seed and step: same mask; next step: a different one
  op->forward(st, X, Y2, mask.get(), 42, 0);
  EXPECT_EQ(Y2.download(), y);
  op->forward(st, X, Y2, mask.get(), 42, 1);
  EXPECT_NE(Y2.download(), y);
  EXPECT_THROW(be->make_dropout(X.t().desc, 1.0), UsageError);
}

}  // namespace
}  // namespace stepbench
