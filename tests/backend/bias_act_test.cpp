// A convolution's bias and ReLU (BiasActOp) against the oracle: in place forward, and the backward's
// masked gradient (overwritten or accumulated) and the bias gradient, its sum over n, h, w.
#include <fmt/format.h>

#include <cmath>
#include <tuple>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

TEST_P(Ops, BiasActAddsTheBiasAndSumsItsGradient) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  auto& st = be->default_stream();
  // a channel slice (an output written into a concat), and a dense tensor wide enough for vectors
  for (const auto& [s, before, after] :
       {std::tuple{Shape{2, 5, 3, 4}, std::int64_t{1}, std::int64_t{2}}, std::tuple{Shape{3, 19, 5, 7}, 0l, 0l}})
    for (const bool relu : {true, false}) {
      SCOPED_TRACE(fmt::format("{}{}", to_string(s), relu ? ", relu" : ", no relu"));
      const auto n = static_cast<std::size_t>(s.numel());
      const auto x = test::round_to(dtype, random_vec(n, 30)), dy = test::round_to(dtype, random_vec(n, 31)),
                 acc = test::round_to(dtype, random_vec(n, 32));
      const auto b = random_vec(static_cast<std::size_t>(s.c), 33);
      DevTensor Y(*be, s, layout, dtype, before, after), DY(*be, s, layout, dtype, after, before),
          DX(*be, s, layout, dtype, before, 0);
      DevVec B(*be, b), DB(*be, static_cast<std::size_t>(s.c));
      Y.upload(x);
      DY.upload(dy);
      auto op = be->make_bias_act(Y.t().desc, relu);
      op->forward(st, Y, B.get());
      ref::Vec y_ref, g, db;
      ref::bias_act_forward(s, x, test::round_to(DType::f32, b), relu, y_ref);
      // one fp32 addition, rounded to the storage type; its sign is exact, so is the ReLU
      EXPECT_WITHIN(Y.download(), y_ref,
                    test::plus_rounding(test::axpby(m.u_acc, test::absv(y_ref), 0, {}), y_ref, m.u_out));
      std::size_t masked = 0;
      for (double v : y_ref) masked += v == 0;
      if (relu) {
        ASSERT_GT(masked, n / 8) << "the data must exercise the mask";
      }
      const auto y_got = Y.download();
      ref::bias_act_backward(s, y_got, dy, relu, g, db);
      // the bias gradient: a sum of N H W terms in fp32 or better
      ref::Vec edb(db.size());
      for (std::int64_t c = 0; c < s.c; ++c) {
        double abs_sum = 0;
        for (std::int64_t i = 0; i < s.n; ++i)
          for (std::int64_t h = 0; h < s.h; ++h)
            for (std::int64_t w = 0; w < s.w; ++w) abs_sum += std::abs(g[ref::idx(s, i, c, h, w)]);
        edb[static_cast<std::size_t>(c)] = test::ErrorModel{}.sum(s.n * s.h * s.w) * abs_sum;
      }
      edb = test::plus_rounding(edb, db, 0x1p-24);
      // dx overwritten, then accumulated
      op->backward(st, Y, DY, DX, 0.0f, DB.get());
      EXPECT_EQ(DX.download(), g);  // a copy of dy or zero: exact
      EXPECT_WITHIN(DB.get_host(), db, edb);
      DX.upload(acc);
      op->backward(st, Y, DY, DX, 1.0f, DB.get());
      ref::Vec sum(n);
      for (std::size_t i = 0; i < n; ++i) sum[i] = g[i] + acc[i];
      EXPECT_WITHIN(DX.download(), sum,
                    test::plus_rounding(test::axpby(m.u_acc, test::absv(sum), 0, {}), sum, m.u_out));
      EXPECT_WITHIN(DB.get_host(), db, edb) << "db is overwritten, not accumulated";
      // in place: dx is dy itself (the conv layer's use)
      op->backward(st, Y, DY, DY, 0.0f, DB.get());
      EXPECT_EQ(DY.download(), g);
    }
}

}  // namespace
}  // namespace stepbench
