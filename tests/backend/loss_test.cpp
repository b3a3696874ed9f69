// Softmax cross-entropy: the loss, its gradient, and the gradient scaled by a loss scale.
#include <cmath>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

TEST_P(Ops, SoftmaxCrossEntropy) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const std::int64_t N = 4, M = 10;
  const auto z = test::round_to(dtype, random_vec(N * M, 19, -3, 3));  // as the backend holds them
  std::vector<std::int32_t> labels{3, 0, 9, 5};
  ref::Vec dz_ref;
  const double loss_ref = ref::softmax_xent(N, M, z, labels, dz_ref);
  DevTensor Z(*be, {N, M, 1, 1}, layout, dtype), DZ(*be, {N, M, 1, 1}, layout, dtype);
  Z.upload(z);
  Buffer lab(*be, N * 4);
  auto& st = be->default_stream();
  be->copy(st, lab.get(), labels.data(), N * 4);
  DevVec loss(*be, 1);
  auto op = be->make_softmax_cross_entropy(Z.t().desc);
  Buffer reserve(*be, op->reserve_bytes());
  // the error model: per row, M exponentials summed in fp32 (the log of the sum is off by the sum's
  // relative error), the row's loss from three terms; the mean over N rows; softmax probabilities
  // off by the sum's relative error; the gradient stored in the dtype
  const auto m = test::error_model(GetParam());
  double loss_bound = 0, mean_abs_row = 0;
  ref::Vec e_dz(dz_ref.size());
  for (std::int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY, se = 0;
    for (std::int64_t j = 0; j < M; ++j) mx = std::max(mx, z[n * M + j]);
    for (std::int64_t j = 0; j < M; ++j) se += std::exp(z[n * M + j] - mx);
    const double row = std::log(se) + mx - z[n * M + labels[n]];
    loss_bound += (m.sum(M) + 3 * m.u_acc + 2 * m.u_acc * (std::abs(std::log(se)) + std::abs(mx) + std::abs(row))) / N;
    mean_abs_row += std::abs(row) / N;
    for (std::int64_t j = 0; j < M; ++j)
      e_dz[n * M + j] = (std::exp(z[n * M + j] - mx) / se * (m.sum(M) + 4 * m.u_acc) +
                         2 * m.u_acc * (std::exp(z[n * M + j] - mx) / se + (j == labels[n] ? 1.0 : 0.0))) /  // p - 1
                        N;
  }
  loss_bound += m.sum(N) * mean_abs_row;
  op->forward(st, Z, lab.as<std::int32_t>(), loss, reserve.get());
  EXPECT_NEAR(loss.get_host()[0], loss_ref, loss_bound);
  op->backward(st, lab.as<std::int32_t>(), DZ, 0.4f, 0.0f, reserve.get(), nullptr);
  for (auto& v : dz_ref) v *= 0.4;
  EXPECT_WITHIN(DZ.download(), dz_ref, test::plus_rounding(test::axpby(0.4, e_dz, 0, {}), dz_ref, m.u_out));
  // a loss scale in device memory multiplies the gradient (dynamic loss scaling): a power of two, exact
  DevVec ls(*be, std::vector<double>{8.0});
  op->backward(st, lab.as<std::int32_t>(), DZ, 0.4f, 0.0f, reserve.get(), ls);
  for (auto& v : dz_ref) v *= 8.0;
  EXPECT_WITHIN(DZ.download(), dz_ref, test::plus_rounding(test::axpby(3.2, e_dz, 0, {}), dz_ref, m.u_out));
  if (be->kind() == DeviceKind::cpu) {
    labels[2] = 10;  // out of range: a clear error, not a wild read
    be->copy(st, lab.get(), labels.data(), N * 4);
    EXPECT_THROW(op->forward(st, Z, lab.as<std::int32_t>(), loss, reserve.get()), UsageError);
  }
}

}  // namespace
}  // namespace stepbench
