// The fully connected layer with bias: forward, backward data and backward weights.
#include <utility>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

TEST_P(Ops, LinearWithBias) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  const std::int64_t N = 3, K = 17, M = 6;
  auto r = [&](ref::Vec v) { return test::round_to(dtype, std::move(v)); };
  const auto x = r(random_vec(N * K, 13)), w = r(random_vec(M * K, 14)), b = r(random_vec(M, 15)),
             dy = r(random_vec(N * M, 16));
  ref::Vec y_ref, dx_ref, dw_ref, db_ref;
  ref::linear_forward(N, K, M, x, w, b, y_ref);
  ref::linear_backward(N, K, M, x, w, dy, dx_ref, dw_ref, db_ref);
  // bounds: the oracle on absolute values gives each sum's sum of |terms|
  ref::Vec ay, adx, adw, adb;
  ref::linear_forward(N, K, M, test::absv(x), test::absv(w), test::absv(b), ay);
  ref::linear_backward(N, K, M, test::absv(x), test::absv(w), test::absv(dy), adx, adw, adb);
  // the product is stored in the dtype before the bias is added (cuBLAS, then our kernel): two roundings
  const auto ey = test::plus_rounding(test::axpby(m.sum(K + 1) + m.u_out, ay, 0, {}), y_ref, m.u_out);
  const auto edx = test::plus_rounding(test::axpby(m.sum(M), adx, 0, {}), dx_ref, m.u_out);
  const auto edw = test::plus_rounding(test::axpby(m.sum(N), adw, 0, {}), dw_ref, m.u_out);
  const auto edb = test::plus_rounding(test::axpby(m.sum(N), adb, 0, {}), db_ref, m.u_out);
  DevTensor X(*be, {N, K, 1, 1}, layout, dtype), Y(*be, {N, M, 1, 1}, layout, dtype),
      DY(*be, {N, M, 1, 1}, layout, dtype), DX(*be, {N, K, 1, 1}, layout, dtype);
  DevVec W(*be, w, dtype), B(*be, b, dtype), DW(*be, w.size(), dtype), DB(*be, b.size(), dtype);
  X.upload(x);
  DY.upload(dy);
  auto op = be->make_linear(X.t().desc, Y.t().desc);
  Buffer ws(*be, op->workspace_bytes());
  auto& s = be->default_stream();
  op->forward(s, X, W, B, Y, ws.get());
  EXPECT_WITHIN(Y.download(), y_ref, ey);
  op->backward_data(s, DY, W, DX, 0.0f, ws.get());
  EXPECT_WITHIN(DX.download(), dx_ref, edx);
  op->backward_weights(s, X, DY, DW, DB, ws.get());
  EXPECT_WITHIN(DW.get_host(), dw_ref, edw);
  EXPECT_WITHIN(DB.get_host(), db_ref, edb);
}

}  // namespace
}  // namespace stepbench
