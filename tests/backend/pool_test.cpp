// Max and average pooling (Inception's kinds, global average included), forward and backward.
#include <fmt/format.h>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

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
    // wide enough for the cpu kernels' vector bodies (channels and rows past 16 floats, remainders)
    {"max_3x3_s2_wide", {1, 17, 3, 29}, {PoolKind::max, 3, 3, 2, 2, 0, 0}},  // distinct_vec: <= 1536 values
    {"avg_3x3_s1_p1_wide", {2, 37, 6, 35}, {PoolKind::avg_include_pad, 3, 3, 1, 1, 1, 1}},
    {"avg_3x3_s1_p1_exclude_pad_wide", {1, 19, 5, 37}, {PoolKind::avg_exclude_pad, 3, 3, 1, 1, 1, 1}},
    // floor mode dropping a remainder (the last window stops short of the padding on the right)
    {"avg_3x3_s2_p1_floor", {2, 4, 8, 9}, {PoolKind::avg_include_pad, 3, 3, 2, 2, 1, 1}},
    {"avg_3x3_s2_p1_floor_exclude_pad", {2, 4, 8, 9}, {PoolKind::avg_exclude_pad, 3, 3, 2, 2, 1, 1}},
};

TEST_P(Ops, Pooling) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  // y and dy a channel slice (as a branch ending in a concat), or dense (as a pool feeding a conv)
  for (const auto& pc : kPoolCases)
    for (bool sliced : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, {} output", pc.name, sliced ? "sliced" : "dense"));
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
      const int before = sliced ? 3 : 0, after = sliced ? 1 : 0;
      DevTensor X(*be, pc.x, layout, dtype), Y(*be, ys, layout, dtype, before, after),
          DY(*be, ys, layout, dtype, before, after), DX(*be, pc.x, layout, dtype);
      X.upload(x);
      DY.upload(dy);
      auto op = be->make_pool(X.t().desc, Y.t().desc, pc.p);
      if (be->kind() == DeviceKind::cpu) {  // oneDNN's average pooling on dense NHWC (max pooling: see pool_dnnl.cpp)
        const bool avx512 = be->versions().at("cpu_isa").rfind("avx512", 0) == 0;
        EXPECT_EQ(op->implementation().rfind("oneDNN", 0) == 0,
                  avx512 && dtype == DType::f32 && layout == Layout::nhwc && !sliced && pc.p.kind != PoolKind::max)
            << op->implementation();
      }
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

// What the Pooling test's max cases rest on, checked without a GPU: their inputs are the same values
// in fp32, bf16 and fp16 (the oracle is fed what the backend holds), and no window of any max case
// has two maxima in any of them (where a tied maximum routes the gradient is undocumented in cuDNN).
TEST(PoolInputs, MaxPoolWindowsHaveOneMaximumInEveryPrecision) {
  for (const auto& pc : kPoolCases) {
    if (pc.p.kind != PoolKind::max) continue;
    SCOPED_TRACE(pc.name);
    const auto x = test::distinct_vec(static_cast<std::size_t>(pc.x.numel()), 8);
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      const auto r = test::round_to(t, x);
      EXPECT_EQ(r, x) << to_string(t) << ": rounding moved an input";
      const Shape ys = pool_output_shape(pc.x, pc.p);
      const auto& P = pc.p;
      for (std::int64_t nc = 0; nc < pc.x.n * pc.x.c; ++nc)
        for (std::int64_t oh = 0; oh < ys.h; ++oh)
          for (std::int64_t ow = 0; ow < ys.w; ++ow) {
            double best = -INFINITY;
            int count = 0;
            for (int i = 0; i < P.kh; ++i)
              for (int j = 0; j < P.kw; ++j) {
                const std::int64_t h = oh * P.stride_h - P.pad_h + i, w = ow * P.stride_w - P.pad_w + j;
                if (h < 0 || h >= pc.x.h || w < 0 || w >= pc.x.w) continue;
                const double v = r[static_cast<std::size_t>((nc * pc.x.h + h) * pc.x.w + w)];
                if (v > best) {
                  best = v;
                  count = 1;
                } else if (v == best) {
                  ++count;
                }
              }
            EXPECT_EQ(count, 1) << to_string(t) << " window (" << nc << ", " << oh << ", " << ow << ")";
          }
    }
  }
}

}  // namespace
}  // namespace stepbench
