// Hand-written CPU kernels for the ops oneDNN 2.6 runs only on reference code when a tensor is a
// strided channel slice (batch norm, pooling, elementwise), plus those it has no primitive for
// (dropout, loss, optimizers). fp32, NCHW or NHWC, any strides. OpenMP-parallel.
#pragma once
#include <cstdint>

#include "stepbench/backend.hpp"

namespace stepbench::cpu {

// scratch: at least bn_scratch_doubles(C) doubles, reused across calls.
std::size_t bn_scratch_doubles(std::int64_t channels);
void bn_forward_training(const Tensor& x, const Tensor& y, const float* gamma, const float* beta, float* running_mean,
                         float* running_var, float* save_mean, float* save_invstd, const BatchNormParams& p,
                         double* scratch);
void bn_forward_inference(const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                          const float* running_mean, const float* running_var, const BatchNormParams& p,
                          double* scratch);
void bn_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const float* gamma,
                 const float* save_mean, const float* save_invstd, float* dgamma, float* dbeta, float beta_dx,
                 bool relu, double* scratch);

void pool_forward(const Tensor& x, const Tensor& y, const PoolParams& p, std::int32_t* argmax);
void pool_backward(const Tensor& dy, const Tensor& dx, const PoolParams& p, float beta, const std::int32_t* argmax);

void relu_forward(const Tensor& x, const Tensor& y);
void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, float beta);
void add(const Tensor& src, const Tensor& dst, float beta);  // dst = src + beta * dst

void dropout_forward(const Tensor& x, const Tensor& y, std::uint8_t* mask, double p, std::uint64_t seed,
                     std::uint64_t step);
void dropout_backward(const Tensor& dy, const Tensor& dx, float beta, const std::uint8_t* mask, double p);

void softmax_xent_forward(const Tensor& logits, const std::int32_t* labels, float* loss, float* probs);
void softmax_xent_backward(const std::int32_t* labels, const Tensor& dlogits, float scale, float beta,
                           const float* probs);

void optimizer_update(const OptimizerConfig& cfg, float* params, const float* grads, float* s0, float* s1,
                      std::size_t n, float inv_scale = 1.0f);  // grads * inv_scale: loss scaling
void scale(float* x, float alpha, std::size_t n);
void fill(float* x, float v, std::size_t n);

}  // namespace stepbench::cpu
