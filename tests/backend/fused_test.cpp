// The fused convolution + batch-norm unit's pieces (backend/fused.hpp) against the oracle: a unit's
// finalize (its statistics, saved and running, with and without its output stored), its apply
// (training and inference), its backward with the ReLU's mask from y and made again from z; a
// convolution that loads its input through the producing unit's batch norm, forward, backward data
// and backward filter; the residual add + ReLU with one or both inputs loaded that way.
#include <fmt/format.h>

#include <cmath>

#include "backend/fused.hpp"
#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

// A unit's batch norm in backend memory: its parameters, statistics and buffers, and its norm.
struct Unit {
  std::unique_ptr<BnUnitOp> op;
  DevVec gamma, beta, rm, rv, sm, si;
  Buffer ws, reserve, stats, norm;
  Unit(Backend& be, const TensorDesc& z, const TensorDesc& y, const BatchNormParams& bp, bool stored, const ref::Vec& g,
       const ref::Vec& b)
      : op(be.make_bn_unit(z, y, {bp, stored})),
        gamma(be, g),
        beta(be, b),
        rm(be, std::vector<double>(static_cast<std::size_t>(z.shape.c), 0.5)),
        rv(be, std::vector<double>(static_cast<std::size_t>(z.shape.c), 2.0)),
        sm(be, static_cast<std::size_t>(z.shape.c)),
        si(be, static_cast<std::size_t>(z.shape.c)),
        ws(be, std::max(op->workspace_bytes(), op->apply_workspace_bytes())),
        reserve(be, op->reserve_bytes()),
        stats(be, op->stats_bytes()),
        norm(be, op->norm_bytes()) {}
  void finalize(Stream& s, const Tensor& z, const Tensor& y) {  // the statistics where a convolution made them
    op->finalize(s, z, op->stats_bytes() ? stats.get() : nullptr, gamma, beta, rm, rv, sm, si, norm.get(), y, ws.get(),
                 reserve.get());
  }
  UnitNorm n(bool training) const {
    return {op.get(), training, gamma, beta, sm, si, rm, rv, reserve.get(), norm.get()};
  }
};

// The running statistics after one training forward from 0.5 and 2.0 (momentum 0.1, unbiased
// variance), with their bounds.
void expect_running(const Unit& u, const ref::BnSaved& saved, const test::BnBounds& eb, const test::ErrorModel& m) {
  const std::size_t C = saved.mean.size();
  ref::Vec rm(C), rv(C), erm(C), erv(C);
  for (std::size_t c = 0; c < C; ++c) {
    rm[c] = 0.9 * 0.5 + 0.1 * saved.mean[c];
    rv[c] = 0.9 * 2.0 + 0.1 * saved.var_unbiased[c];
    erm[c] = 0.1 * eb.mean[c] + 3 * m.u_acc * std::abs(rm[c]);
    erv[c] = 0.1 * eb.var_unbiased[c] + 3 * m.u_acc * std::abs(rv[c]);
  }
  EXPECT_WITHIN(u.rm.get_host(), rm, erm);
  EXPECT_WITHIN(u.rv.get_host(), rv, erv);
}

struct FusedCase {
  const char* name;
  Shape z;  // the producing unit's output, the convolution's input
  std::int64_t cout;
  ConvParams p;
};
// ResNet's 3x3 after a 1x1 unit, its strided 1x1 downsample, Inception's 1x7; 16+ channels and rows
// for the cpu kernels' vector bodies in one of them
const FusedCase kCases[] = {
    {"3x3_s1_p1", {2, 5, 7, 8}, 6, {3, 3, 1, 1, 1, 1}},
    {"1x1_s2", {3, 17, 6, 6}, 5, {1, 1, 2, 2, 0, 0}},
    {"1x7_p0_3", {2, 4, 5, 9}, 3, {1, 7, 1, 1, 0, 3}},
    // large enough for oneDNN's batch norm on an AVX-512 cpu (NHWC fp32): y of the statistics-only
    // forward and the mask go to the workspace, its kernel's scratch after them
    {"1x1_64x64", {2, 16, 64, 64}, 4, {1, 1, 1, 1, 0, 0}},
};

// Every workspace byte 0xff (a NaN in fp32 and bf16) before a call: a piece that reads scratch it did
// not write, or writes it where another part of it lives, shows.
void poison(Backend& be, const Buffer& ws) {
  if (!ws.bytes()) return;
  const std::vector<unsigned char> nan(ws.bytes(), 0xff);
  be.copy(be.default_stream(), ws.get(), nan.data(), nan.size());
  be.synchronize(be.default_stream());
}

TEST_P(Ops, FusedUnitPieces) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  auto& st = be->default_stream();
  for (const auto& cc : kCases)
    for (bool relu : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, {}", cc.name, relu ? "relu" : "no relu"));
      const Shape& s = cc.z;
      const Shape ys = conv_output_shape(s, cc.cout, cc.p);
      const auto z = test::round_to(dtype, random_vec(s.numel(), 31, -2, 3));
      const auto gamma = random_vec(s.c, 32, 0.5, 1.5), beta = random_vec(s.c, 33);
      const auto dy = test::round_to(dtype, random_vec(s.numel(), 34));  // at the unit's output
      const auto w = test::round_to(dtype, random_vec(cc.cout * s.c * cc.p.kh * cc.p.kw, 35));
      const auto dout = test::round_to(dtype, random_vec(ys.numel(), 36));  // at the convolution's output
      BatchNormParams bp;
      bp.relu = relu;
      ref::Vec y_ref, dz_ref, dg_ref, db_ref;
      ref::BnSaved saved;
      ref::bn_forward_training(s, z, gamma, beta, bp.eps, relu, y_ref, saved);
      ref::bn_backward(s, z, y_ref, dy, gamma, saved, relu, dz_ref, dg_ref, db_ref);
      const auto eb = test::bn_bounds(s, z, {}, gamma, beta, bp.eps, relu, dy, saved, m);

      DevTensor Z(*be, s, layout, dtype), Y(*be, s, layout, dtype), DY(*be, s, layout, dtype),
          DZ(*be, s, layout, dtype), OUT(*be, ys, layout, dtype), DOUT(*be, ys, layout, dtype),
          DX(*be, s, layout, dtype);
      Z.upload(z);
      DY.upload(dy);
      DOUT.upload(dout);
      DevVec DG(*be, s.c), DB(*be, s.c);

      // not stored: finalize makes the statistics only, a reader applies them
      Unit u(*be, Z.t().desc, Z.t().desc, bp, false, gamma, beta);
      SCOPED_TRACE(u.op->implementation());
      poison(*be, u.ws);
      u.finalize(st, Z, Tensor{});
      EXPECT_WITHIN(u.sm.get_host(), saved.mean, eb.mean);
      EXPECT_WITHIN(u.si.get_host(), saved.invstd, eb.invstd);
      expect_running(u, saved, eb, m);
      const UnitNorm n = u.n(true);
      poison(*be, u.ws);
      u.op->apply(st, Z, n, Y, u.ws.get());
      EXPECT_WITHIN(Y.download(), y_ref, eb.y);
      // backward with the ReLU's mask made again from z
      poison(*be, u.ws);
      u.op->backward(st, Z, n, Tensor{}, DY, DZ, DG, DB, u.ws.get());
      EXPECT_WITHIN(DZ.download(), dz_ref, eb.dx);
      EXPECT_WITHIN(DG.get_host(), dg_ref, eb.dgamma);
      EXPECT_WITHIN(DB.get_host(), db_ref, eb.dbeta);

      // stored: finalize writes y too, backward takes the mask from it
      DevTensor YS(*be, s, layout, dtype, 1, 2);  // a channel slice, as a concat's part
      Unit us(*be, Z.t().desc, YS.t().desc, bp, true, gamma, beta);
      us.finalize(st, Z, YS);
      EXPECT_WITHIN(YS.download(), y_ref, eb.y);
      EXPECT_WITHIN(us.si.get_host(), saved.invstd, eb.invstd);
      DZ.upload(std::vector<double>(static_cast<std::size_t>(s.numel()), 7.0));
      DB.set(std::vector<double>(static_cast<std::size_t>(s.c), 7.0));  // overwritten, not added to
      poison(*be, us.ws);
      us.op->backward(st, Z, us.n(true), YS, DY, DZ, DG, DB, us.ws.get());
      EXPECT_WITHIN(DZ.download(), dz_ref, eb.dx);
      EXPECT_WITHIN(DG.get_host(), dg_ref, eb.dgamma);
      EXPECT_WITHIN(DB.get_host(), db_ref, eb.dbeta);

      // the convolution loading the unit's output through its batch norm
      using test::ConvDirection;
      DevVec W(*be, test::filter_for(*be, layout, w, cc.cout, s.c, cc.p.kh, cc.p.kw), dtype), DW(*be, w.size(), dtype);
      auto conv = be->make_fused_conv(Z.t().desc, OUT.t().desc, {cc.p, u.op.get()}, nullptr);
      SCOPED_TRACE(conv->implementation());
      Buffer ws(*be, conv->workspace_bytes());
      ref::Vec out_ref, dx_ref, dw_ref;
      ref::conv_forward(s, y_ref, w, ys, out_ref, cc.p);
      ref::conv_backward_data(ys, dout, w, s, dx_ref, cc.p);
      ref::conv_backward_filter(s, y_ref, ys, dout, dw_ref, cc.p);
      poison(*be, ws);
      conv->forward(st, Z, &n, W, OUT, nullptr, ws.get());
      EXPECT_WITHIN(OUT.download(), out_ref,
                    test::conv_forward_bound(s, y_ref, eb.y, w, ys, out_ref, cc.p,
                                             for_conv(m, conv->algorithm(), ConvDirection::forward)));
      conv->backward_data(st, DOUT, W, DX, 0.0f, ws.get());
      EXPECT_WITHIN(DX.download(), dx_ref,
                    test::conv_backward_data_bound(ys, dout, {}, w, s, dx_ref, cc.p,
                                                   for_conv(m, conv->algorithm(), ConvDirection::backward_data)));
      poison(*be, ws);
      conv->backward_filter(st, Z, &n, DOUT, DW, ws.get());
      ref::Vec inherited;  // the loaded input's own error, through the filter gradient's sum
      ref::conv_backward_filter(s, eb.y, ys, test::absv(dout), inherited, cc.p);
      EXPECT_WITHIN(
          test::filter_back(*be, layout, DW.get_host(), cc.cout, s.c, cc.p.kh, cc.p.kw), dw_ref,
          test::axpby(1,
                      test::conv_backward_filter_bound(s, y_ref, ys, dout, {}, dw_ref, cc.p,
                                                       for_conv(m, conv->algorithm(), ConvDirection::backward_filter)),
                      1, inherited));

      // inference: the running statistics (those finalize left), in the load and in apply
      const auto rm = u.rm.get_host(), rv = u.rv.get_host();
      ref::Vec yi_ref, outi_ref;
      ref::bn_forward_inference(s, z, gamma, beta, rm, rv, bp.eps, relu, yi_ref);
      const auto eyi = test::bn_inference_bound(s, z, gamma, beta, rm, rv, {}, {}, bp.eps, yi_ref, m);
      const UnitNorm ni = u.n(false);
      u.op->apply(st, Z, ni, Y, u.ws.get());
      EXPECT_WITHIN(Y.download(), yi_ref, eyi);
      ref::conv_forward(s, yi_ref, w, ys, outi_ref, cc.p);
      conv->forward(st, Z, &ni, W, OUT, nullptr, ws.get());
      EXPECT_WITHIN(OUT.download(), outi_ref,
                    test::conv_forward_bound(s, yi_ref, eyi, w, ys, outi_ref, cc.p,
                                             for_conv(m, conv->algorithm(), ConvDirection::forward)));

      // and a plain input: the convolution of z itself
      auto plain = be->make_fused_conv(Z.t().desc, OUT.t().desc, {cc.p, nullptr}, nullptr);
      Buffer pws(*be, plain->workspace_bytes());
      ref::Vec outp_ref;
      ref::conv_forward(s, z, w, ys, outp_ref, cc.p);
      plain->forward(st, Z, nullptr, W, OUT, nullptr, pws.get());
      EXPECT_WITHIN(OUT.download(), outp_ref,
                    test::conv_forward_bound(s, z, {}, w, ys, outp_ref, cc.p,
                                             for_conv(m, plain->algorithm(), ConvDirection::forward)));
    }
}

// relu(a' + b'), a' a unit's output loaded through its batch norm (no ReLU: a ResNet conv3 or
// downsample), b' another such, or a plain tensor (the identity shortcut).
TEST_P(Ops, FusedBnAddRelu) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  auto& st = be->default_stream();
  const Shape s{2, 18, 5, 6};
  const auto n = static_cast<std::size_t>(s.numel());
  BatchNormParams bp;
  bp.relu = false;
  bp.eps = 1e-5;
  const auto za = test::round_to(dtype, random_vec(n, 41, -2, 3)), zb = test::round_to(dtype, random_vec(n, 42, -1, 2));
  const auto ga = random_vec(s.c, 43, 0.5, 1.5), ba = random_vec(s.c, 44), gb = random_vec(s.c, 45, 0.5, 1.5),
             bb = random_vec(s.c, 46), dy = test::round_to(dtype, random_vec(n, 47)),
             acc = test::round_to(dtype, random_vec(n, 48));
  ref::Vec ya, yb;
  ref::BnSaved sa, sb;
  ref::bn_forward_training(s, za, ga, ba, bp.eps, false, ya, sa);
  ref::bn_forward_training(s, zb, gb, bb, bp.eps, false, yb, sb);
  const auto ea = test::bn_bounds(s, za, {}, ga, ba, bp.eps, false, dy, sa, m),
             eb = test::bn_bounds(s, zb, {}, gb, bb, bp.eps, false, dy, sb, m);
  DevTensor ZA(*be, s, layout, dtype), ZB(*be, s, layout, dtype), Y(*be, s, layout, dtype), DY(*be, s, layout, dtype),
      DA(*be, s, layout, dtype), DB(*be, s, layout, dtype);
  ZA.upload(za);
  ZB.upload(zb);
  DY.upload(dy);
  Unit ua(*be, ZA.t().desc, ZA.t().desc, bp, false, ga, ba), ub(*be, ZB.t().desc, ZB.t().desc, bp, false, gb, bb);
  ua.finalize(st, ZA, Tensor{});
  ub.finalize(st, ZB, Tensor{});
  const UnitNorm na = ua.n(true), nb = ub.n(true);
  for (const bool both : {false, true}) {
    SCOPED_TRACE(both ? "both inputs loaded through their batch norm" : "one loaded, the other plain");
    auto op = be->make_bn_add_relu(Y.t().desc, ua.op.get(), both ? ub.op.get() : nullptr);
    SCOPED_TRACE(op->implementation());
    Buffer ws(*be, op->workspace_bytes());
    op->forward(st, ZA, &na, ZB, both ? &nb : nullptr, Y, ws.get());
    const ref::Vec& b = both ? yb : zb;
    ref::Vec y_ref, bound(n);
    ref::add_relu_forward(ya, b, y_ref);
    for (std::size_t i = 0; i < n; ++i)  // the inputs' bounds, the sum's rounding, the stored result's
      bound[i] = ea.y[i] + (both ? eb.y[i] : 0) + (m.u_acc + m.u_out) * (std::abs(ya[i]) + std::abs(b[i]));
    EXPECT_WITHIN(Y.download(), y_ref, bound);
    std::size_t masked = 0;
    for (double v : y_ref) masked += v == 0;
    ASSERT_GT(masked, n / 8) << "the data must exercise the mask";
    // backward: the mask of the stored output, the same gradient to both inputs (one accumulated)
    ref::Vec g;
    ref::add_relu_backward(Y.download(), dy, g);
    DA.upload(acc);
    op->backward(st, Y, DY, DA, 1.0f, DB, 0.0f);
    EXPECT_EQ(DB.download(), g);
    ref::Vec sum(n), esum(n);
    for (std::size_t i = 0; i < n; ++i) sum[i] = g[i] + acc[i], esum[i] = (m.u_acc + m.u_out) * std::abs(sum[i]);
    EXPECT_WITHIN(DA.download(), sum, esum);
  }
}

// The canaries the tests keep in a unit's statistics, factors and reserve (Backend::set_fused_canaries):
// the convolution writes the statistics, finalize checks them and writes the rest, the loads and
// backward check those; a buffer that held something else when it was read (a lifetime too short) is
// an error naming it.
TEST(FusedCanaries, AClobberedBufferOfTheUnitIsNamed) {
  auto be = make_cpu_backend();
  be->set_fused_canaries(true);
  auto& st = be->default_stream();
  const Shape s{2, 4, 5, 5};
  DevTensor X(*be, s, Layout::nhwc), Z(*be, s, Layout::nhwc), Y(*be, s, Layout::nhwc);
  X.upload(random_vec(s.numel(), 51));
  Unit u(*be, Z.t().desc, Z.t().desc, BatchNormParams{}, false, random_vec(s.c, 52, 0.5, 1.5), random_vec(s.c, 53));
  ASSERT_GT(u.op->stats_bytes(), 0u);
  ASSERT_GT(u.op->norm_bytes(), 0u);
  auto conv = be->make_fused_conv(X.t().desc, Z.t().desc, {{3, 3, 1, 1, 1, 1}, nullptr, u.op.get()}, nullptr);
  EXPECT_TRUE(conv->makes_statistics());
  DevVec W(*be, test::filter_for(*be, Layout::nhwc, random_vec(4 * 4 * 9, 54), 4, 4, 3, 3));
  Buffer ws(*be, conv->workspace_bytes());
  conv->forward(st, X, nullptr, W, Z, u.stats.get(), ws.get());
  u.finalize(st, Z, Tensor{});  // the statistics the convolution wrote
  EXPECT_NO_THROW(u.op->apply(st, Z, u.n(true), Y, u.ws.get()));
  const std::vector<char> other(64, 3);
  be->copy(st, u.norm.get(), other.data(), other.size());
  EXPECT_THROW(u.op->apply(st, Z, u.n(true), Y, u.ws.get()), Error);
  u.finalize(st, Z, Tensor{});
  be->copy(st, u.stats.get(), other.data(), other.size());  // statistics another unit's convolution left
  try {
    u.finalize(st, Z, Tensor{});
    ADD_FAILURE() << "clobbered statistics went unseen";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("statistics"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stepbench
