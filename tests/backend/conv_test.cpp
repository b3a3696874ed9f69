// Convolution forward, backward data (overwriting and accumulating) and backward filter against the
// oracle, over the kernel shapes Inception, ResNet and MobileNet-v2 (grouped, depthwise) use.
#include <fmt/format.h>

#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

struct ConvCase {
  const char* name;
  Shape x;
  std::int64_t cout;
  ConvParams p;
};
// The kernel shapes Inception and ResNet use, on small inputs.
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
    // and ResNet's: the 7x7 stem and the strided 1x1 downsample
    {"7x7_s2_p3_stem", {2, 3, 16, 16}, 8, {7, 7, 2, 2, 3, 3}},
    {"1x1_s2_downsample", {3, 4, 10, 10}, 5, {1, 1, 2, 2, 0, 0}},
    // grouped, and MobileNet-v2's depthwise 3x3 (groups = channels), strided, and wide enough for the
    // kernels' vectors over channels
    {"3x3_p1_groups2", {2, 6, 7, 7}, 4, {3, 3, 1, 1, 1, 1, 2}},
    {"depthwise_3x3_p1", {2, 8, 7, 7}, 8, {3, 3, 1, 1, 1, 1, 8}},
    {"depthwise_3x3_s2_p1", {2, 5, 9, 9}, 5, {3, 3, 2, 2, 1, 1, 5}},
    {"depthwise_3x3_p1_wide", {2, 32, 6, 6}, 32, {3, 3, 1, 1, 1, 1, 32}},
};

TEST_P(Ops, Convolution) {
  SB_BACKEND_OR_SKIP(be, GetParam());
  const auto& [_, layout, dtype, tf32_] = GetParam();
  const auto m = test::error_model(GetParam());
  int stored_cases = 0;
  // each case on the backend's plain filter format, and again on its own filter storage where it
  // has one for the shapes (oneDNN's blocked weights: make_conv_stored)
  for (const auto& cc : kConvCases)
    for (bool stored : {false, true}) {
      SCOPED_TRACE(fmt::format("{}{}", cc.name, stored ? ", filter in the backend's own storage" : ""));
      const Shape ys = conv_output_shape(cc.x, cc.cout, cc.p);
      // the values the backend holds after the upload
      const auto x = test::round_to(dtype, random_vec(cc.x.numel(), 1));
      const std::int64_t cin = cc.x.c / cc.p.groups;  // the filter's input channels: its group's
      const auto w = test::round_to(dtype, random_vec(cc.cout * cin * cc.p.kh * cc.p.kw, 2));
      const auto dy = test::round_to(dtype, random_vec(ys.numel(), 3));
      ref::Vec y_ref, dx_ref, dw_ref;
      ref::conv_forward(cc.x, x, w, ys, y_ref, cc.p);
      ref::conv_backward_data(ys, dy, w, cc.x, dx_ref, cc.p);
      ref::conv_backward_filter(cc.x, x, ys, dy, dw_ref, cc.p);

      DevTensor X(*be, cc.x, layout, dtype), Y(*be, ys, layout, dtype), DY(*be, ys, layout, dtype),
          DX(*be, cc.x, layout, dtype);
      const auto storage = stored ? be->conv_filter_storage(X.t().desc, Y.t().desc, cc.p) : nullptr;
      if (stored && !storage) continue;
      stored_cases += stored;
      auto to_storage = [&](const ref::Vec& oihw) {
        if (!storage) return test::filter_for(*be, layout, oihw, cc.cout, cin, cc.p.kh, cc.p.kw);
        const std::vector<float> f(oihw.begin(), oihw.end());
        std::vector<float> st(storage->floats());
        storage->to_storage(f.data(), st.data());
        return std::vector<double>(st.begin(), st.end());
      };
      auto from_storage = [&](const std::vector<double>& st) {
        if (!storage) return test::filter_back(*be, layout, st, cc.cout, cin, cc.p.kh, cc.p.kw);
        const std::vector<float> f(st.begin(), st.end());
        std::vector<float> oihw(w.size());
        storage->from_storage(f.data(), oihw.data());
        return std::vector<double>(oihw.begin(), oihw.end());
      };
      DevVec W(*be, to_storage(w), dtype), DW(*be, storage ? storage->floats() : w.size(), dtype);
      X.upload(x);
      DY.upload(dy);
      auto op = storage ? be->make_conv_stored(X.t().desc, Y.t().desc, cc.p, *storage)
                        : be->make_conv(X.t().desc, Y.t().desc, cc.p);
      SCOPED_TRACE(op->algorithm());
      // the transform factor only for a direction cuDNN runs through FFT or Winograd
      using test::ConvDirection;
      const auto ey = test::conv_forward_bound(cc.x, x, {}, w, ys, y_ref, cc.p,
                                               for_conv(m, op->algorithm(), ConvDirection::forward));
      const auto edx = test::conv_backward_data_bound(ys, dy, {}, w, cc.x, dx_ref, cc.p,
                                                      for_conv(m, op->algorithm(), ConvDirection::backward_data));
      const auto edw = test::conv_backward_filter_bound(cc.x, x, ys, dy, {}, dw_ref, cc.p,
                                                        for_conv(m, op->algorithm(), ConvDirection::backward_filter));
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
      const auto dw = DW.get_host();
      EXPECT_WITHIN(from_storage(dw), dw_ref, edw);
      if (storage) {  // the gradient's padding (where the storage's ones map nothing) is zero
        const auto placed = to_storage(ref::Vec(w.size(), 1.0));
        for (std::size_t i = 0; i < placed.size(); ++i)
          if (placed[i] == 0.0) {
            EXPECT_EQ(dw[i], 0.0) << "padding float " << i << " of " << storage->name();
          }
      }
    }
  // (not a bf16 run where bf16 is emulated, on AVX-512 without AVX512_BF16: the emulation's filter
  // stays plain; fp32 there keeps the check, though the tests turn the emulation on for every config)
  const bool emulated = be->versions().at("bf16").rfind("emulated", 0) == 0;
  if (be->kind() == DeviceKind::cpu && be->versions().at("cpu_isa").rfind("avx512", 0) == 0 &&
      !(dtype == DType::bf16 && emulated)) {
    EXPECT_GT(stored_cases, 0) << "oneDNN's direct kernels run on its own weight format on AVX-512";
  }
}

// The transform factor per direction, read from the algorithm cuDNN picked (ErrorModel::transform
// is kTransform on cuda): FFT and Winograd keep it, the GEMM and direct algorithms drop it, and a
// report that is not cuDNN's keeps the worst case.
TEST(ErrorModel, TransformOnlyWhereCudnnRunsOne) {
  auto m = test::error_model({"cuda", Layout::nchw, DType::f32});
  ASSERT_EQ(m.transform, test::kTransform);
  using D = test::ConvDirection;
  const std::string gemm = "cudnn fwd algo 1 / bwd_data algo 1 / bwd_filter algo 3";
  for (D d : {D::forward, D::backward_data, D::backward_filter}) EXPECT_EQ(for_conv(m, gemm, d).transform, 1.0);
  const std::string fft = "cudnn fwd algo 5 / bwd_data algo 3 / bwd_filter algo 2 (channels padded 3 -> 8)";
  for (D d : {D::forward, D::backward_data, D::backward_filter})
    EXPECT_EQ(for_conv(m, fft, d).transform, test::kTransform);
  const std::string wino = "cudnn fwd algo 7 / bwd_data algo 5 / bwd_filter algo 5";
  for (D d : {D::forward, D::backward_data, D::backward_filter})
    EXPECT_EQ(for_conv(m, wino, d).transform, test::kTransform);
  const std::string mixed = "cudnn fwd algo 6 / bwd_data algo 0 / bwd_filter algo 0";
  EXPECT_EQ(for_conv(m, mixed, D::forward).transform, test::kTransform);
  EXPECT_EQ(for_conv(m, mixed, D::backward_data).transform, 1.0);
  EXPECT_EQ(for_conv(m, mixed, D::backward_filter).transform, 1.0);
  EXPECT_EQ(for_conv(m, "jit:avx512_core", D::forward).transform, test::kTransform) << "not cuDNN's: unknown";
  EXPECT_EQ(for_conv(m, "", D::backward_data).transform, test::kTransform);
  // a tighter bound: the accumulation term shrinks by the factor
  EXPECT_LT(for_conv(m, gemm, D::forward).conv(1000), m.conv(1000) / 32);
}

}  // namespace
}  // namespace stepbench
