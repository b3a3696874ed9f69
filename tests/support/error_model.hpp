// The error model of the oracle tests, stated once: how far a correct backend may be from the
// double-precision oracle, element by element, given the precision it computes in and the test's
// own data. Tolerances come from here, not from constants tuned on one machine's kernels.
//
// A backend computes every sum in fp32 (unit roundoff u_acc = 2^-24). A sum of K terms whose
// absolute values add up to A is off by at most K * u_acc * A in the worst case; rounding errors
// of different partial sums are independent and of either sign, so kSigmas * sqrt(K) * u_acc * A
// bounds it in practice (the partial sums never exceed A). The operands of each product may be
// rounded first: TF32 math rounds fp32 operands to 11 significant bits (u_in = 2^-11), and a
// graph in bf16/fp16 convolves 16-bit copies of its fp32 weights; that adds 2 * u_in * A. A result
// stored in bf16/fp16 is rounded once more (u_out times its magnitude). cuDNN may run a
// convolution through FFT or Winograd transforms, whose accumulated error grows with the transform
// (Lavin & Gray 2016; Barabasz et al. 2020: Winograd F(4x4, 3x3) 10-100x direct convolution's):
// on cuda the fp32 accumulation term is multiplied by kTransform, for each convolution direction
// whose algorithm (ConvOp::algorithm(), in LayerInfo::conv_algorithm) is one of cuDNN's FFT or
// Winograd algorithms, or whose algorithm is not known (for_conv). A 16-bit convolution on cuda may
// instead accumulate in 16 bits (u_conv_acc); the bound takes the worse of the two, not both.
//
// Errors are propagated to first order through each op with the oracle itself: the oracle is
// linear in each argument of a convolution, so conv(|x|, |w|) is the A of every output, and
// conv(|x|, E_dy) carries an upstream error bound E_dy through the next op.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "support/reference.hpp"

namespace stepbench::test {

struct Config;

constexpr double kSigmas = 4;      // the statistical bound's multiplier on sqrt(K) * u * A
constexpr double kTransform = 64;  // cuDNN FFT/Winograd convolutions' error growth (cuda only)

struct ErrorModel {
  double u_in = 0;         // rounding of the operands of each product
  double u_acc = 0x1p-24;  // fp32 accumulation
  double u_out = 0x1p-24;  // the storage type of results
  double transform = 1;    // kTransform on cuda
  // cuDNN's non-deterministic 16-bit convolution algorithms add partial results atomically into
  // the output, in its 16-bit type: on cuda in bf16/fp16 a convolution accumulates at u_out
  double u_conv_acc = 0x1p-24;
  // Towers: a sum over the batch is `towers` partial sums (one per tower), then their average.
  // Only the chain oracle's fully connected layers use it (batch_sum): right for models without
  // convolutions or batch norm (pool_fc), whose gradients are then those of the whole batch.
  int towers = 1;
  // A sum of K terms: its error relative to the sum of its terms' absolute values.
  double sum(std::int64_t K) const;
  // The same for a sum over the batch, split over the towers: each partial sum of K / towers
  // terms, then the sum of the partial sums (whose absolute values add up to at most the same).
  double batch_sum(std::int64_t K) const;
  // The same for a convolution (which cuDNN may compute through a transform).
  double conv(std::int64_t K) const;
};
ErrorModel error_model(const Config& c);

// The model for one direction of one convolution: the transform factor stays only where
// `algorithm` (the cuda backend's "cudnn fwd algo F / bwd_data algo D / bwd_filter algo W") names
// an FFT or Winograd algorithm for that direction (forward 4-7, backward-data 2-5, backward-filter 2,
// 4-6 in cuDNN's enums), or where it cannot be read (an empty or other backend's report keeps m).
enum class ConvDirection { forward, backward_data, backward_filter };
ErrorModel for_conv(const ErrorModel& m, const std::string& algorithm, ConvDirection d);

using Vec = ref::Vec;
Vec absv(const Vec& v);
// a * x + b * y, elementwise (y may be empty: zero)
Vec axpby(double a, const Vec& x, double b, const Vec& y);
// bound + u * |v|: the rounding of a stored result
Vec plus_rounding(Vec bound, const Vec& v, double u);

// Bounds of a convolution's outputs; ex / edy: bounds of errors already in x / dy (empty: exact).
Vec conv_forward_bound(const Shape& xs, const Vec& x, const Vec& ex, const Vec& w, const Shape& ys, const Vec& y,
                       const ConvParams& p, const ErrorModel& m);
Vec conv_backward_data_bound(const Shape& ys, const Vec& dy, const Vec& edy, const Vec& w, const Shape& xs,
                             const Vec& dx, const ConvParams& p, const ErrorModel& m);
Vec conv_backward_filter_bound(const Shape& xs, const Vec& x, const Shape& ys, const Vec& dy, const Vec& edy,
                               const Vec& dw, const ConvParams& p, const ErrorModel& m);

// Batch norm (training statistics, ReLU optional) from x with error bound ex (empty: exact), and
// its backward from dy with error bound edy; egamma / ebeta bound errors already in the parameters
// (empty: exact). Where the ReLU's input lies within its own error of zero, the backend's mask may
// differ from the oracle's: that element's gradient may be dy or 0.
struct BnBounds {
  Vec y, mean, invstd, var_unbiased, dx, dgamma, dbeta;
};
BnBounds bn_bounds(const Shape& s, const Vec& x, const Vec& ex, const Vec& gamma, const Vec& beta, double eps,
                   bool relu, const Vec& dy, const ref::BnSaved& saved, const ErrorModel& m, const Vec& edy = {},
                   const Vec& egamma = {}, const Vec& ebeta = {});
// Inference with running statistics that carry errors erm / erv (empty: exact).
Vec bn_inference_bound(const Shape& s, const Vec& x, const Vec& gamma, const Vec& beta, const Vec& rmean,
                       const Vec& rvar, const Vec& erm, const Vec& erv, double eps, const Vec& y, const ErrorModel& m);

Vec pool_forward_bound(const Shape& xs, const Vec& x, const Shape& ys, const Vec& y, const PoolParams& p,
                       const ErrorModel& m);
Vec pool_backward_bound(const Shape& xs, const Vec& x, const Shape& ys, const Vec& dy, const Vec& dx,
                        const PoolParams& p, const ErrorModel& m);

// |got_i - want_i| <= bound_i for every i (and equal lengths); the message names the worst element.
testing::AssertionResult within(const Vec& got, const Vec& want, const Vec& bound);
#define EXPECT_WITHIN(got, want, bound) EXPECT_TRUE(::stepbench::test::within(got, want, bound)) << "for " #got

}  // namespace stepbench::test
