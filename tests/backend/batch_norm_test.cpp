// Batch norm: training forward (with and without the fused ReLU, from and into a slice or dense),
// its recompute from the saved statistics, the running statistics, backward, and the inference
// forward, against the oracle.
#include <fmt/format.h>

#include <cmath>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

TEST_P(Ops, BatchNormTrainingInferenceBackward) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  // y and dy are slices (channels 2..c+2 of c+4), as when a branch ends in a concat, or dense, as
  // when the next conv reads them (on the cuda backend, NHWC dense is where cuDNN fuses the ReLU).
  // Shapes: a small one; one wide enough for the vector bodies of the cpu kernels (channels and rows
  // past 16 floats, with remainders); the 1x1 pixels of Inception-v3's auxiliary head (768 channels);
  // one large enough that the cpu backend runs oneDNN's batch norm on it (NHWC, dense output).
  for (const Shape& s : {Shape{3, 5, 4, 6}, Shape{2, 37, 3, 35}, Shape{8, 768, 1, 1}, Shape{2, 32, 64, 65}})
    for (bool relu : {true, false})
      for (bool sliced : {true, false}) {
        SCOPED_TRACE(fmt::format("{}x{}x{}x{}, {}, {} output", s.n, s.c, s.h, s.w, relu ? "fused relu" : "no relu",
                                 sliced ? "sliced" : "dense"));
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
        // sliced: x and dx too, as DenseNet's pre-activation reads its block's prefix and adds into its gradient
        DevTensor X(*be, s, layout, dtype, 0, sliced ? 3 : 0), Y(*be, s, layout, dtype, before, after),
            DY(*be, s, layout, dtype, sliced ? 1 : 0, sliced ? 3 : 0), DX(*be, s, layout, dtype, 0, sliced ? 5 : 0);
        X.upload(x);
        DY.upload(dy);
        DevVec G(*be, gamma), B(*be, beta), RM(*be, std::vector<double>(s.c, 0.5)),
            RV(*be, std::vector<double>(s.c, 2.0)), SM(*be, s.c), SI(*be, s.c), DG(*be, s.c), DB(*be, s.c);
        auto op = be->make_batch_norm(X.t().desc, Y.t().desc, bp);
        if (be->kind() == DeviceKind::cpu) {  // oneDNN's where it was measured faster (batch_norm_dnnl.cpp)
          const bool avx512 = be->versions().at("cpu_isa").rfind("avx512", 0) == 0;
          EXPECT_EQ(op->implementation().rfind("oneDNN", 0) == 0,
                    avx512 && dtype == DType::f32 && layout == Layout::nhwc && !sliced && s.h * s.w >= 4096)
              << op->implementation();
        }
        Buffer ws(*be, op->workspace_bytes()), reserve(*be, op->reserve_bytes());
        auto& st = be->default_stream();
        op->forward_training(st, X, Y, G, B, RM, RV, SM, SI, ws.get(), reserve.get());
        EXPECT_WITHIN(Y.download(), y_ref, eb.y);
        if (sliced) {  // neighbours of the slice are untouched
          const auto raw = Y.raw();
          const Strides ds = dense_strides({s.n, s.c + 4, s.h, s.w}, layout);
          for (std::int64_t n = 0; n < s.n; ++n)
            for (std::int64_t c : {std::int64_t{0}, std::int64_t{1}, s.c + 2, s.c + 3})
              EXPECT_EQ(raw[static_cast<std::size_t>(n * ds.n + c * ds.c + (s.h - 1) * ds.h)], 0.0f);
        }
        // the recompute (GraphConfig::recompute) from what the training forward saved: on the cpu
        // backend the same bits (its kernels apply the same factors; oneDNN's its own kernel again),
        // elsewhere within the forward's bound
        const auto y_fwd = Y.raw();
        Y.upload(std::vector<double>(static_cast<std::size_t>(s.numel()), -7.0));
        op->forward_recompute(st, X, Y, G, B, SM, SI, ws.get(), reserve.get());
        if (be->kind() == DeviceKind::cpu)
          EXPECT_EQ(Y.raw(), y_fwd) << op->implementation();
        else
          EXPECT_WITHIN(Y.download(), y_ref, eb.y);
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

// A NaN in a channel makes that channel's output NaN, as in PyTorch, on every cpu path: the
// hand-written kernels, and oneDNN's (whose fused ReLU would write 0 for NaN: that step runs the
// hand-written forward). The other channels stay finite.
TEST_P(Ops, BatchNormKeepsANanOfItsInput) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  if (be->kind() != DeviceKind::cpu) GTEST_SKIP() << "the cpu backend's rule (cuDNN's is its own)";
  const Shape s{2, 32, 64, 65};  // large enough for oneDNN's kernel where the cpu has it
  auto x = random_vec(s.numel(), 4, -2, 3);
  x[static_cast<std::size_t>(((1 * s.c + 3) * s.h + 5) * s.w + 7)] = NAN;  // n 1, c 3, h 5, w 7 (NCHW order)
  for (bool relu : {true, false}) {
    SCOPED_TRACE(relu ? "fused relu" : "no relu");
    BatchNormParams bp;
    bp.relu = relu;
    DevTensor X(*be, s, layout, dtype), Y(*be, s, layout, dtype);
    X.upload(x);
    DevVec G(*be, random_vec(s.c, 5, 0.5, 1.5)), B(*be, random_vec(s.c, 6)), RM(*be, std::vector<double>(s.c, 0.5)),
        RV(*be, std::vector<double>(s.c, 2.0)), SM(*be, s.c), SI(*be, s.c);
    auto op = be->make_batch_norm(X.t().desc, Y.t().desc, bp);
    Buffer ws(*be, op->workspace_bytes()), reserve(*be, op->reserve_bytes());
    op->forward_training(be->default_stream(), X, Y, G, B, RM, RV, SM, SI, ws.get(), reserve.get());
    const auto y = Y.download();
    std::int64_t nan_in_3 = 0, non_finite_elsewhere = 0;
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t c = 0; c < s.c; ++c)
        for (std::int64_t i = 0; i < s.h * s.w; ++i) {
          const double v = y[static_cast<std::size_t>((n * s.c + c) * s.h * s.w + i)];
          if (c == 3)
            nan_in_3 += std::isnan(v);
          else
            non_finite_elsewhere += !std::isfinite(v);
        }
    EXPECT_EQ(nan_in_3, s.n * s.h * s.w) << op->implementation();
    EXPECT_EQ(non_finite_elsewhere, 0);
  }
}

}  // namespace
}  // namespace stepbench
