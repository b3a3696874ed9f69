// The residual add + ReLU (AddReluOp) against the oracle: forward, and the backward's fan-out of
// one masked gradient into both inputs, each overwritten or accumulated on its own beta.
#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

// One fp32 addition, then the result stored in the tensor's type.
test::Vec one_add_bound(const test::ErrorModel& m, const ref::Vec& want) {
  return test::plus_rounding(test::axpby(m.u_acc, test::absv(want), 0, {}), want, m.u_out);
}

// Nonzero floats of the whole buffer outside the view (its buffer starts zeroed).
std::size_t written_outside(const DevTensor& t) {
  std::size_t in = 0, all = 0;
  for (double v : t.download()) in += v != 0;
  for (float v : t.raw()) all += v != 0;
  return all - in;
}

struct AddReluCase {
  Shape s;
  std::int64_t before, after;  // channels around the views: 0, 0 for dense tensors
};

TEST_P(Ops, AddReluSendsOneMaskedGradientToBothInputs) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  auto& st = be->default_stream();
  // channel slices (the strided paths), and dense tensors whose rows the cuda kernels vectorise
  for (const AddReluCase& c : {AddReluCase{{2, 5, 3, 4}, 1, 2}, AddReluCase{{2, 8, 4, 4}, 0, 0}}) {
    const Shape s = c.s;
    SCOPED_TRACE(to_string(s));
    const auto n = static_cast<std::size_t>(s.numel());
    const auto a = test::round_to(dtype, random_vec(n, 20)), b = test::round_to(dtype, random_vec(n, 21)),
               dy = test::round_to(dtype, random_vec(n, 22)), acc_a = test::round_to(dtype, random_vec(n, 23)),
               acc_b = test::round_to(dtype, random_vec(n, 24));
    DevTensor A(*be, s, layout, dtype, c.before, c.after), B(*be, s, layout, dtype),
        Y(*be, s, layout, dtype, c.after, 0), DY(*be, s, layout, dtype, 0, c.after),
        DA(*be, s, layout, dtype, c.before, 0), DB(*be, s, layout, dtype, c.after, c.before);
    A.upload(a);
    B.upload(b);
    DY.upload(dy);
    auto op = be->make_add_relu(Y.t().desc);
    op->forward(st, A, B, Y);
    ref::Vec y_ref, g;
    ref::add_relu_forward(a, b, y_ref);
    // the sum of two stored values rounds once and cannot change its sign: the ReLU is exact
    EXPECT_WITHIN(Y.download(), y_ref, one_add_bound(m, y_ref));
    EXPECT_EQ(written_outside(Y), 0u) << "the forward wrote outside its channel slice";
    ref::add_relu_backward(y_ref, dy, g);
    std::size_t masked = 0;
    for (double v : y_ref) masked += v == 0;
    ASSERT_GT(masked, n / 8) << "the data must exercise the mask";

    // da accumulates, db is overwritten; then the other way round
    for (const bool accumulate_a : {true, false}) {
      SCOPED_TRACE(accumulate_a ? "da += g, db = g" : "da = g, db += g");
      DA.upload(acc_a);
      DB.upload(acc_b);
      op->backward(st, Y, DY, DA, accumulate_a ? 1.0f : 0.0f, DB, accumulate_a ? 0.0f : 1.0f);
      ref::Vec sum(n);
      const ref::Vec& acc = accumulate_a ? acc_a : acc_b;
      for (std::size_t i = 0; i < n; ++i) sum[i] = g[i] + acc[i];
      const auto got_acc = (accumulate_a ? DA : DB).download(), got_plain = (accumulate_a ? DB : DA).download();
      EXPECT_WITHIN(got_acc, sum, one_add_bound(m, sum));
      EXPECT_EQ(got_plain, g);  // a copy of dy or zero: exact in every type
      EXPECT_EQ(written_outside(DA) + written_outside(DB), 0u) << "the backward wrote outside its slices";
    }
    // an input without a gradient (no data) is skipped; the other still gets its gradient
    DA.upload(acc_a);
    DB.upload(acc_b);
    op->backward(st, Y, DY, Tensor{}, 0.0f, DB, 0.0f);
    EXPECT_EQ(DB.download(), g);
    EXPECT_EQ(DA.download(), acc_a);
    op->backward(st, Y, DY, DA, 0.0f, Tensor{}, 0.0f);
    EXPECT_EQ(DA.download(), g);
  }
}

}  // namespace
}  // namespace stepbench
