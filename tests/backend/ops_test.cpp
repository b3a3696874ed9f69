// Every backend op, forward and backward, against the naive oracle; typed over backend x layout x
// precision. Outputs and incoming gradients are channel slices of wider buffers, as they are when a
// branch writes into its concat, so the strided paths are what is tested.
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "support/test_util.hpp"

namespace stepbench {
namespace {

using test::DevTensor;
using test::DevVec;
using test::random_vec;

class Ops : public testing::TestWithParam<test::Config> {};

struct ConvCase {
  const char* name;
  Shape x;
  std::int64_t cout;
  ConvParams p;
};
// The kernel shapes Inception uses, on small inputs.
const ConvCase kConvCases[] = {
    {"3x3_s1_p1", {2, 5, 9, 9}, 6, {3, 3, 1, 1, 1, 1}},
    {"3x3_s2_p0", {2, 4, 11, 11}, 5, {3, 3, 2, 2, 0, 0}},
    {"stem_3ch_3x3_s2", {2, 3, 15, 15}, 8, {3, 3, 2, 2, 0, 0}},
    {"1x1", {3, 7, 6, 6}, 4, {1, 1, 1, 1, 0, 0}},
    {"1x7_p0_3", {2, 4, 9, 9}, 5, {1, 7, 1, 1, 0, 3}},
    {"7x1_p3_0", {2, 4, 9, 9}, 5, {7, 1, 1, 1, 3, 0}},
    {"1x3_p0_1", {2, 6, 5, 5}, 3, {1, 3, 1, 1, 0, 1}},
    {"3x1_p1_0", {2, 6, 5, 5}, 3, {3, 1, 1, 1, 1, 0}},
    {"5x5_p2", {2, 3, 8, 8}, 4, {5, 5, 1, 1, 2, 2}},
    {"5x5_p0_aux", {2, 6, 5, 5}, 7, {5, 5, 1, 1, 0, 0}},
};

TEST_P(Ops, Convolution) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  for (const auto& cc : kConvCases) {
    SCOPED_TRACE(cc.name);
    const Shape ys = conv_output_shape(cc.x, cc.cout, cc.p);
    // the values the backend holds after the upload
    const auto x = test::round_to(dtype, random_vec(cc.x.numel(), 1));
    const auto w = test::round_to(dtype, random_vec(cc.cout * cc.x.c * cc.p.kh * cc.p.kw, 2));
    const auto dy = test::round_to(dtype, random_vec(ys.numel(), 3));
    ref::Vec y_ref, dx_ref, dw_ref;
    ref::conv_forward(cc.x, x, w, ys, y_ref, cc.p);
    ref::conv_backward_data(ys, dy, w, cc.x, dx_ref, cc.p);
    ref::conv_backward_filter(cc.x, x, ys, dy, dw_ref, cc.p);
    const auto ey = test::conv_forward_bound(cc.x, x, {}, w, ys, y_ref, cc.p, m);
    const auto edx = test::conv_backward_data_bound(ys, dy, {}, w, cc.x, dx_ref, cc.p, m);
    const auto edw = test::conv_backward_filter_bound(cc.x, x, ys, dy, {}, dw_ref, cc.p, m);

    DevTensor X(*be, cc.x, layout, dtype), Y(*be, ys, layout, dtype), DY(*be, ys, layout, dtype),
        DX(*be, cc.x, layout, dtype);
    DevVec W(*be, test::filter_for(*be, layout, w, cc.cout, cc.x.c, cc.p.kh, cc.p.kw), dtype), DW(*be, w.size(), dtype);
    X.upload(x);
    DY.upload(dy);
    auto op = be->make_conv(X.t().desc, Y.t().desc, cc.p);
    SCOPED_TRACE(op->algorithm());
    Buffer ws(*be, op->workspace_bytes());
    auto& s = be->default_stream();
    op->forward(s, X, W, Y, ws.get());
    EXPECT_WITHIN(Y.download(), y_ref, ey);
    op->backward_data(s, DY, W, DX, 0.0f, ws.get());
    EXPECT_WITHIN(DX.download(), dx_ref, edx);
    // beta = 1 accumulates: a second pass doubles the gradient (two such errors, and one more rounding)
    op->backward_data(s, DY, W, DX, 1.0f, ws.get());
    EXPECT_WITHIN(DX.download(), test::axpby(2, dx_ref, 0, {}),
                  test::plus_rounding(test::axpby(2, edx, 0, {}), dx_ref, 2 * m.u_out));
    op->backward_filter(s, X, DY, DW, ws.get());
    EXPECT_WITHIN(test::filter_back(*be, layout, DW.get_host(), cc.cout, cc.x.c, cc.p.kh, cc.p.kw), dw_ref, edw);
  }
}

TEST_P(Ops, BatchNormTrainingInferenceBackward) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  // y and dy are slices (channels 2..6 of 9), as when a branch ends in a concat, or dense, as when
  // the next conv reads them (on the cuda backend, NHWC dense is where cuDNN fuses the ReLU)
  for (bool relu : {true, false})
    for (bool sliced : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, {} output", relu ? "fused relu" : "no relu", sliced ? "sliced" : "dense"));
      const Shape s{3, 5, 4, 6};
      const auto x = test::round_to(dtype, random_vec(s.numel(), 4, -2, 3));
      const auto gamma = random_vec(s.c, 5, 0.5, 1.5), beta = random_vec(s.c, 6);  // fp32 on every backend
      const auto dy = test::round_to(dtype, random_vec(s.numel(), 7));
      BatchNormParams bp;
      bp.relu = relu;
      ref::Vec y_ref, dx_ref, dg_ref, db_ref;
      ref::BnSaved saved;
      ref::bn_forward_training(s, x, gamma, beta, bp.eps, relu, y_ref, saved);
      ref::bn_backward(s, x, y_ref, dy, gamma, saved, relu, dx_ref, dg_ref, db_ref);
      const auto eb = test::bn_bounds(s, x, {}, gamma, beta, bp.eps, relu, dy, saved, m);

      const int before = sliced ? 2 : 0, after = sliced ? 2 : 0;
      DevTensor X(*be, s, layout, dtype), Y(*be, s, layout, dtype, before, after),
          DY(*be, s, layout, dtype, sliced ? 1 : 0, sliced ? 3 : 0), DX(*be, s, layout, dtype);
      X.upload(x);
      DY.upload(dy);
      DevVec G(*be, gamma), B(*be, beta), RM(*be, std::vector<double>(s.c, 0.5)),
          RV(*be, std::vector<double>(s.c, 2.0)), SM(*be, s.c), SI(*be, s.c), DG(*be, s.c), DB(*be, s.c);
      auto op = be->make_batch_norm(X.t().desc, Y.t().desc, bp);
      Buffer ws(*be, op->workspace_bytes()), reserve(*be, op->reserve_bytes());
      auto& st = be->default_stream();
      op->forward_training(st, X, Y, G, B, RM, RV, SM, SI, ws.get(), reserve.get());
      EXPECT_WITHIN(Y.download(), y_ref, eb.y);
      if (sliced) {  // neighbours of the slice are untouched
        const auto raw = Y.raw();
        const Strides ds = dense_strides({s.n, s.c + 4, s.h, s.w}, layout);
        for (std::int64_t n = 0; n < s.n; ++n)
          for (std::int64_t c : {0, 1, 7, 8})
            EXPECT_EQ(raw[static_cast<std::size_t>(n * ds.n + c * ds.c + 2 * ds.h)], 0.0f);
      }
      EXPECT_WITHIN(SM.get_host(), saved.mean, eb.mean);
      EXPECT_WITHIN(SI.get_host(), saved.invstd, eb.invstd);
      // running statistics: momentum 0.1, unbiased variance (PyTorch); fp32 whatever the dtype
      ref::Vec rm(s.c), rv(s.c), erm(s.c), erv(s.c);
      for (std::int64_t c = 0; c < s.c; ++c) {
        rm[c] = 0.9 * 0.5 + 0.1 * saved.mean[c];
        rv[c] = 0.9 * 2.0 + 0.1 * saved.var_unbiased[c];
        erm[c] = 0.1 * eb.mean[c] + 3 * m.u_acc * std::abs(rm[c]);
        erv[c] = 0.1 * eb.var_unbiased[c] + 3 * m.u_acc * std::abs(rv[c]);
      }
      EXPECT_WITHIN(RM.get_host(), rm, erm);
      EXPECT_WITHIN(RV.get_host(), rv, erv);

      op->backward(st, X, Y, DY, DX, G, B, SM, SI, DG, DB, 0.0f, ws.get(), reserve.get());
      EXPECT_WITHIN(DX.download(), dx_ref, eb.dx);
      EXPECT_WITHIN(DG.get_host(), dg_ref, eb.dgamma);
      EXPECT_WITHIN(DB.get_host(), db_ref, eb.dbeta);
      op->backward(st, X, Y, DY, DX, G, B, SM, SI, DG, DB, 1.0f, ws.get(), reserve.get());
      EXPECT_WITHIN(DX.download(), test::axpby(2, dx_ref, 0, {}),
                    test::plus_rounding(test::axpby(2, eb.dx, 0, {}), dx_ref, 2 * m.u_out));
      EXPECT_EQ(DY.download(), dy);  // the incoming gradient is read, never changed

      ref::Vec yi_ref;
      ref::bn_forward_inference(s, x, gamma, beta, rm, rv, bp.eps, relu, yi_ref);
      op->forward_inference(st, X, Y, G, B, RM, RV, ws.get());
      EXPECT_WITHIN(Y.download(), yi_ref,
                    test::bn_inference_bound(s, x, gamma, beta, rm, rv, erm, erv, bp.eps, yi_ref, m));
    }
}

struct PoolCase {
  const char* name;
  Shape x;
  PoolParams p;
};
const PoolCase kPoolCases[] = {
    {"max_3x3_s2", {2, 3, 9, 9}, {PoolKind::max, 3, 3, 2, 2, 0, 0}},
    {"max_3x3_s2_even", {2, 3, 8, 10}, {PoolKind::max, 3, 3, 2, 2, 0, 0}},
    {"avg_3x3_s1_p1_count_pad", {2, 4, 5, 5}, {PoolKind::avg_include_pad, 3, 3, 1, 1, 1, 1}},
    {"avg_3x3_s1_p1_exclude_pad", {2, 4, 5, 5}, {PoolKind::avg_exclude_pad, 3, 3, 1, 1, 1, 1}},
    {"avg_5x5_s3_aux", {2, 3, 17, 17}, {PoolKind::avg_include_pad, 5, 5, 3, 3, 0, 0}},
    {"global_avg", {3, 5, 8, 8}, {PoolKind::avg_include_pad, 8, 8, 1, 1, 0, 0}},
    {"max_3x3_s1_p1", {2, 3, 6, 6}, {PoolKind::max, 3, 3, 1, 1, 1, 1}},
};

TEST_P(Ops, Pooling) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  for (const auto& pc : kPoolCases) {
    SCOPED_TRACE(pc.name);
    const Shape ys = pool_output_shape(pc.x, pc.p);
    // max pooling: distinct values, so no window has two maxima; average: the values the backend
    // holds after the upload
    const auto x = pc.p.kind == PoolKind::max ? test::distinct_vec(static_cast<std::size_t>(pc.x.numel()), 8)
                                              : test::round_to(dtype, random_vec(pc.x.numel(), 8));
    const auto dy = test::round_to(dtype, random_vec(ys.numel(), 9));
    ref::Vec y_ref, dx_ref;
    ref::pool_forward(pc.x, x, ys, y_ref, pc.p);
    ref::pool_backward(pc.x, x, ys, dy, dx_ref, pc.p);
    const auto ey = test::pool_forward_bound(pc.x, x, ys, y_ref, pc.p, m);
    const auto edx = test::pool_backward_bound(pc.x, x, ys, dy, dx_ref, pc.p, m);
    DevTensor X(*be, pc.x, layout, dtype), Y(*be, ys, layout, dtype, 3, 1), DY(*be, ys, layout, dtype, 3, 1),
        DX(*be, pc.x, layout, dtype);
    X.upload(x);
    DY.upload(dy);
    auto op = be->make_pool(X.t().desc, Y.t().desc, pc.p);
    Buffer reserve(*be, op->reserve_bytes());
    auto& s = be->default_stream();
    op->forward(s, X, Y, reserve.get());
    EXPECT_WITHIN(Y.download(), y_ref, ey);
    op->backward(s, X, Y, DY, DX, 0.0f, reserve.get());
    EXPECT_WITHIN(DX.download(), dx_ref, edx);
    op->backward(s, X, Y, DY, DX, 1.0f, reserve.get());
    EXPECT_WITHIN(DX.download(), test::axpby(2, dx_ref, 0, {}),
                  test::plus_rounding(test::axpby(2, edx, 0, {}), dx_ref, 2 * m.u_out));
  }
}

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
  auto op = be->make_relu(X.t().desc, Y.t().desc);
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
      // x is rounded to the storage type on upload, the scaling by 1 / (1 - p) = 2 is exact
      EXPECT_NEAR(y[i], x[i] / (1 - p), 2 * std::max(1e-5, test::unit_roundoff(dtype)) * std::abs(x[i] / (1 - p)));
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

INSTANTIATE_TEST_SUITE_P(AllBackends, Ops, testing::ValuesIn(test::all_configs()), test::config_name);

// Host conversions (what tests and host batches use), against known bit patterns and exhaustively.
TEST(Tensor, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);                          // rounds past the largest half: infinity
  EXPECT_EQ(float_to_f16(-std::ldexp(1.0f, -24)), 0x8001);            // the smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);             // a tie below it goes to even (zero)
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: to even
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: to even (up)
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
  EXPECT_EQ(f16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<std::uint16_t>(h);
    if (!((u & 0x7c00) == 0x7c00 && (u & 0x3ff))) {
      ASSERT_EQ(float_to_f16(f16_to_float(u)), u) << std::hex << h;
    }
    if (!((u & 0x7f80) == 0x7f80 && (u & 0x7f))) {
      ASSERT_EQ(float_to_bf16(bf16_to_float(u)), u) << std::hex << h;
    }
  }
  // halfway between two neighbours rounds to the even one, everywhere in the normal range
  for (std::uint16_t u = 0x0400; u < 0x7bff; u = static_cast<std::uint16_t>(u + 97)) {
    const float mid = 0.5f * (f16_to_float(u) + f16_to_float(static_cast<std::uint16_t>(u + 1)));
    EXPECT_EQ(float_to_f16(mid), (u & 1) ? u + 1 : u) << std::hex << u;
  }
}

// --precision tf32 means tensor-op math on the backend, wherever a backend is made from the
// configuration (the benchmark's towers and `stepbench check` both go through BackendOptions).
TEST(Registry, PrecisionTf32TurnsTensorMathOn) {
  BackendOptions o;
  o.kind = BackendKind::cpu;
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16}) {
    o.precision = p;
    EXPECT_EQ(make_backend(o)->tensor_math(), p == Precision::tf32) << to_string(p);
  }
  EXPECT_EQ(storage_dtype(Precision::tf32), DType::f32);
  EXPECT_EQ(storage_dtype(Precision::bf16), DType::bf16);
}

TEST(Registry, PrecisionTf32TurnsTensorMathOnOnTheGpu) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  BackendOptions o = test::gpu_options();
  o.precision = Precision::tf32;
  auto gpu = make_backend(o);
  EXPECT_TRUE(gpu->tensor_math());
  EXPECT_EQ(gpu->versions().at("tf32"), "on");
  o.precision = Precision::fp32;
  EXPECT_EQ(make_backend(o)->versions().at("tf32"), "off");
}

// Every enum's name table round-trips, and an unknown name is a UsageError naming the choices.
TEST(Names, EveryTableRoundTripsAndRejectsUnknownNames) {
  auto round_trip = [](auto e) {
    using E = decltype(e);
    for (const auto& n : names_of<E>()) EXPECT_EQ(to_string(parse_enum<E>(n, "x")), n);
  };
  round_trip(DType{});
  round_trip(Layout{});
  round_trip(Precision{});
  round_trip(BackendKind{});
  round_trip(OptimizerKind{});
  round_trip(FilterFormat{});
  EXPECT_EQ(parse_enum<DType>("float16", "precision"), DType::f16);  // an alias
  try {
    parse_enum<Precision>("fp64", "precision");
    ADD_FAILURE() << "fp64 parsed";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "unknown precision 'fp64': use fp32, tf32, bf16 or fp16");
  }
}

TEST(Backend, UnknownNamesAreUsageErrors) {
  EXPECT_THROW(parse_enum<BackendKind>("tpu", "backend"), UsageError);
  EXPECT_THROW(parse_enum<Layout>("nwhc", "layout"), UsageError);
  EXPECT_THROW(parse_enum<DType>("fp8", "precision"), UsageError);
  EXPECT_THROW(parse_enum<OptimizerKind>("adam", "optimizer"), UsageError);
}

TEST(Backend, CpuRejectsPrecisionsItCannotRunWithTheReason) {
  auto be = make_cpu_backend();
  EXPECT_NO_THROW(be->require(DType::f32));
  try {
    be->require(DType::bf16);
    FAIL() << "bf16 accepted by an fp32-only backend";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(be->require(DType::f16), UnsupportedError);
}

TEST(Backend, CpuCastsEveryStorageType) {
  auto be = make_cpu_backend();
  const auto v = random_vec(70000, 29, -70000, 70000);  // more than one chunk, beyond fp16's range too
  const std::vector<float> f(v.begin(), v.end());
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<std::uint16_t> dev(f.size()), host(f.size());
    be->cast(be->default_stream(), f.data(), DType::f32, dev.data(), t, f.size());
    convert(f.data(), DType::f32, host.data(), t, f.size());
    EXPECT_EQ(dev, host) << to_string(t);
    std::vector<float> back(f.size());
    be->cast(be->default_stream(), dev.data(), t, back.data(), DType::f32, f.size());
    EXPECT_LE(std::abs(back[0] - f[0]), 0.01 * std::abs(f[0]) + 1e-3) << to_string(t);
  }
}

TEST(Tensor, ChannelSliceKeepsStridesAndShiftsBase) {
  float buf[2 * 6 * 2 * 2];
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    Tensor t{buf, TensorDesc::dense({2, 6, 2, 2}, DType::f32, l)};
    Tensor s = t.channel_slice(2, 3);
    EXPECT_EQ(s.shape().c, 3);
    EXPECT_EQ(s.desc.strides, t.desc.strides);
    EXPECT_FALSE(s.desc.is_dense());
    EXPECT_EQ(s.as<float>(), buf + 2 * t.desc.strides.c);
    EXPECT_THROW(t.channel_slice(4, 3), Error);
  }
}

}  // namespace
}  // namespace stepbench
