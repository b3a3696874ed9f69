// The fused convolution + batch-norm unit, in the pieces MLPerf's ResNet-50 runs on cuDNN (its graph
// API's patterns: scale-bias-ReLU-conv-genstats, BN finalize, BN + add + ReLU, dReLU + dBN,
// scale-bias-ReLU-wgrad). A unit is a convolution and the batch norm (and ReLU) after it. Where the
// unit's output feeds only convolutions or a residual add, it is never stored: each reader applies
// the unit's normalisation and ReLU to its pre-norm convolution output z as it loads it, and
// backward makes the ReLU's mask again from z.
//
// The pieces of one unit, as the graph runs them (GraphConfig::fuse):
//   FusedConvOp::forward          z = conv(x'), x' = x, or the producing unit's normalisation of x
//                                 (applied on load); where makes_statistics(), z's batch statistics too
//   BnUnitOp::finalize            the statistics of z (genstats, unless the convolution made them),
//                                 turned into the saved mean and 1/sqrt(var + eps), the running
//                                 statistics and the backend's factors (norm); y stored where asked
//   BnUnitOp::apply               y = relu?(gamma (z - mean) invstd + beta): a reader's load
//   BnAddReluOp::forward          y = relu(a' + b'), a' and b' each a tensor or a unit's normalisation
//   BnUnitOp::backward            dReLU (the mask from y, or made again from z) + dBN: dz, dgamma, dbeta
//   FusedConvOp::backward_filter  dw from x' (the producing unit's normalisation applied on load)
//   FusedConvOp::backward_data    dx from dz
//
// Backend's make_fused_conv, make_bn_unit and make_bn_add_relu default to the composed pieces
// (fused.cpp): each made of the backend's own ConvOp, BatchNormOp and AddReluOp, with x' and the
// statistics-only forward's y in the workspace. They compute what the unfused ops compute, with
// the same kernels on the same numbers, so where a backend's batch norm recompute gives its training
// forward's bits (the cpu backend) the fused step is the unfused one bit for bit; they save the unit
// outputs no longer stored, less the workspace the loads take. A backend with real fused kernels
// (cuDNN's graph API) overrides the factories and falls back to these where its library declines a
// unit (its pieces then must agree through stats, norm and makes_statistics, as documented below).
// Backend::set_fused_canaries (tests only) makes the composed pieces keep canaries in the unit's
// statistics, factors and reserve, written where the pieces write them and checked where they read
// them, so that the memory plan's lifetimes of those buffers are tested where they hold nothing.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.hpp"

namespace stepbench {

// A unit's batch norm as its readers apply it: y = relu?(gamma (x - mean) invstd + beta) with the
// batch's mean and 1/sqrt(var + eps) that its training forward saved, or (inference) the running
// mean and variance. Pointers into the unit's parameters and buffers, all device memory.
struct UnitNorm {
  BnUnitOp* op = nullptr;  // the unit's batch norm (BnUnitOp::apply)
  bool training = true;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  const float* save_mean = nullptr;  // training
  const float* save_invstd = nullptr;
  const float* running_mean = nullptr;  // inference
  const float* running_var = nullptr;
  const void* reserve = nullptr;  // what the unit's forward keeps for backward (BnUnitOp::reserve_bytes)
  // The unit's factors (BnUnitOp::norm_bytes) as its finalize wrote them (training); nullptr where the
  // unit keeps none (norm_bytes 0) or in inference: a load then works from the statistics above.
  const void* norm = nullptr;
};

// A convolution of a unit: its input plain, or normalised on load by the unit that produced it; its
// output the pre-norm z of `output`, whose statistics it may make in its epilogue (makes_statistics).
struct FusedConvSpec {
  ConvParams conv;
  BnUnitOp* input = nullptr;   // the producing unit (its norm is given to every call), or plain input
  BnUnitOp* output = nullptr;  // the unit this convolution's z is for (made before it), or none
};

class FusedConvOp {
 public:
  virtual ~FusedConvOp() = default;
  virtual std::size_t workspace_bytes() const = 0;
  virtual std::string algorithm() const = 0;       // the convolution's, as ConvOp::algorithm
  virtual std::string implementation() const = 0;  // how the pieces run ("composed: ...")
  // Whether forward writes the output unit's statistics (BnUnitOp::stats_bytes, which must then be
  // more than 0) in its epilogue, for that unit's finalize to read; otherwise finalize is given no
  // statistics and computes them from z.
  virtual bool makes_statistics() const { return false; }
  // in: the producing unit's norm where the spec has an input unit, else nullptr.
  virtual void forward(Stream&, const Tensor& x, const UnitNorm* in, const void* w, const Tensor& z, void* stats,
                       void* ws) = 0;
  virtual void backward_filter(Stream&, const Tensor& x, const UnitNorm* in, const Tensor& dz, void* dw, void* ws) = 0;
  virtual void backward_data(Stream&, const Tensor& dz, const void* w, const Tensor& dx, float beta, void* ws) = 0;
};

// A unit's batch norm (and ReLU): BatchNormParams' eps, momentum and relu, over its z (dense); y is
// where finalize and apply write (the stored output, a channel slice where it is a concat's part), or
// dense where the output is not stored (a reader's x' in its workspace).
struct BnUnitSpec {
  BatchNormParams bn;
  bool stored = true;  // false: finalize is given no y, and backward makes the ReLU's mask from z
};

class BnUnitOp {
 public:
  virtual ~BnUnitOp() = default;
  virtual std::size_t workspace_bytes() const = 0;         // finalize's and backward's
  virtual std::size_t apply_workspace_bytes() const = 0;   // apply's (what a reader gives it)
  virtual std::size_t reserve_bytes() const { return 0; }  // kept from the training forward to backward
  virtual std::size_t stats_bytes() const { return 0; }    // a FusedConvOp's statistics (makes_statistics)
  virtual std::size_t norm_bytes() const { return 0; }     // the backend's own factors, kept with the unit
  virtual const BatchNormParams& params() const = 0;       // eps, momentum, relu
  bool relu() const { return params().relu; }
  virtual std::string implementation() const = 0;
  // Training: the batch statistics of z (from `stats` where the convolution made them, else `stats`
  // is nullptr and they come from z), saved mean and invstd (C floats each), the running statistics
  // updated in place, `norm` filled; where y has data (the unit's output is stored), y =
  // relu?(gamma (z - mean) invstd + beta) as well.
  virtual void finalize(Stream&, const Tensor& z, const void* stats, const float* gamma, const float* beta,
                        float* running_mean, float* running_var, float* save_mean, float* save_invstd, void* norm,
                        const Tensor& y, void* ws, void* reserve) = 0;
  // y = the unit's output from z, with n's statistics (n: this unit's norm): a reader's x', a stored
  // output's inference forward, or its recompute (GraphConfig::recompute).
  virtual void apply(Stream&, const Tensor& z, const UnitNorm& n, const Tensor& y, void* ws) = 0;
  // dy: the gradient at the unit's output. The ReLU's mask from y where y has data (a stored output),
  // else made again from z (or the batch norm's own, kept in the reserve by its forward, where it
  // keeps one: oneDNN's, cuDNN's fused BN + ReLU). Writes dz (overwritten: z's only reader is its own
  // unit), dgamma, dbeta.
  virtual void backward(Stream&, const Tensor& z, const UnitNorm& n, const Tensor& y, const Tensor& dy,
                        const Tensor& dz, float* dgamma, float* dbeta, void* ws) = 0;
};

// A residual connection's sum and ReLU whose inputs may each be a unit's output applied on load: y =
// relu(a' + b'). Backward is AddReluOp's (the mask from y, the stored output): da and db are the
// gradients at a's and b's outputs (for a unit, what its BnUnitOp::backward reads as dy).
class BnAddReluOp {
 public:
  virtual ~BnAddReluOp() = default;
  virtual std::size_t workspace_bytes() const = 0;
  virtual std::string implementation() const = 0;
  // na / nb: the producing unit's norm for a normalised input (a / b is then that unit's z), else
  // nullptr (a plain tensor), as the op was made.
  virtual void forward(Stream&, const Tensor& a, const UnitNorm* na, const Tensor& b, const UnitNorm* nb,
                       const Tensor& y, void* ws) = 0;
  virtual void backward(Stream&, const Tensor& y, const Tensor& dy, const Tensor& da, float beta_a, const Tensor& db,
                        float beta_b) = 0;
};

}  // namespace stepbench
