// The oracle: a naive implementation of every op in plain loops with double accumulation, on dense
// NCHW data. Used by the tests only.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"

namespace stepbench::ref {

using Vec = std::vector<double>;
inline std::size_t idx(const Shape& s, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return static_cast<std::size_t>(((n * s.c + c) * s.h + h) * s.w + w);
}

// w: O x I x KH x KW
void conv_forward(const Shape& xs, const Vec& x, const Vec& w, const Shape& ys, Vec& y, const ConvParams& p);
void conv_backward_data(const Shape& ys, const Vec& dy, const Vec& w, const Shape& xs, Vec& dx, const ConvParams& p);
void conv_backward_filter(const Shape& xs, const Vec& x, const Shape& ys, const Vec& dy, Vec& dw, const ConvParams& p);

struct BnSaved {
  Vec mean, invstd, var_unbiased;
};
void bn_forward_training(const Shape& s, const Vec& x, const Vec& gamma, const Vec& beta, double eps, bool relu, Vec& y,
                         BnSaved& saved);
void bn_forward_inference(const Shape& s, const Vec& x, const Vec& gamma, const Vec& beta, const Vec& rmean,
                          const Vec& rvar, double eps, bool relu, Vec& y);
void bn_backward(const Shape& s, const Vec& x, const Vec& y, const Vec& dy, const Vec& gamma, const BnSaved& saved,
                 bool relu, Vec& dx, Vec& dgamma, Vec& dbeta);

// The residual add + ReLU: y = max(a + b, 0); both inputs' gradient is dy where y > 0, else 0.
void add_relu_forward(const Vec& a, const Vec& b, Vec& y);
void add_relu_backward(const Vec& y, const Vec& dy, Vec& dx);

// A convolution's bias and ReLU: y = relu(x + b[c]) (or x + b[c]); g = dy where y > 0 (everywhere
// without the ReLU), db[c] = the sum of g over n, h, w.
void bias_act_forward(const Shape& s, const Vec& x, const Vec& b, bool relu, Vec& y);
void bias_act_backward(const Shape& s, const Vec& y, const Vec& dy, bool relu, Vec& g, Vec& db);
// PyTorch's AdaptiveAvgPool2d to ys's H x W, and its backward.
void adaptive_avg_pool_forward(const Shape& xs, const Vec& x, const Shape& ys, Vec& y);
void adaptive_avg_pool_backward(const Shape& xs, const Shape& ys, const Vec& dy, Vec& dx);

void pool_forward(const Shape& xs, const Vec& x, const Shape& ys, Vec& y, const PoolParams& p);
void pool_backward(const Shape& xs, const Vec& x, const Shape& ys, const Vec& dy, Vec& dx, const PoolParams& p);

// x: N x K, w: M x K, b: M, y: N x M
void linear_forward(std::int64_t N, std::int64_t K, std::int64_t M, const Vec& x, const Vec& w, const Vec& b, Vec& y);
void linear_backward(std::int64_t N, std::int64_t K, std::int64_t M, const Vec& x, const Vec& w, const Vec& dy, Vec& dx,
                     Vec& dw, Vec& db);

double softmax_xent(std::int64_t N, std::int64_t M, const Vec& logits, const std::vector<std::int32_t>& labels,
                    Vec& dlogits);  // returns the mean loss; dlogits = d(mean loss)/d logits

void optimizer_update(const OptimizerConfig& cfg, Vec& p, const Vec& g, Vec& s0, Vec& s1);

}  // namespace stepbench::ref
