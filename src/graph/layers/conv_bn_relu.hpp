// The conv_bn_relu layer: torchvision's BasicConv2d (Conv2d without bias -> BatchNorm2d -> ReLU), and
// without the ReLU (kind conv_bn: the last convolution of a ResNet bottleneck, its downsample).
// Declared here rather than only in conv_bn_relu.cpp because planning's estimate (plan.cpp) counts
// its pre-norm convolution output z, which no value owns.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/fused.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"

namespace stepbench {

// With GraphConfig::fuse the unit runs as the fused unit's pieces (backend/fused.hpp): `fused`, its
// input loaded through the producing unit's batch norm where in_unit[0] is set, and its own output
// not stored where `stored` is false (graph/fuse.cpp decides both before planning).
struct ConvBnReluLayer final : Layer {
  ConvParams p;
  ConvBnSpec spec;  // parameter names, eps, the ReLU
  std::int64_t cout;
  std::size_t w, gamma, beta, rmean, rvar;
  // conv output (dense), saved mean + invstd, what the BN op keeps; the gradient at z (backward
  // only); the workspace of the forward's and of the backward's pieces; fused: the statistics a
  // convolution's epilogue makes and the backend's factors (both sized by the BnUnitOp, often 0)
  Slot z, saved, bn_reserve, dz, ws_fwd, ws_bwd, stats, norm;
  std::unique_ptr<ConvOp> conv;
  std::unique_ptr<BatchNormOp> bn;
  bool fused = false, stored = true;
  std::unique_ptr<FusedConvOp> fconv;
  std::unique_ptr<BnUnitOp> bnu;
  TensorDesc zdesc;
  // Fused: this unit's batch norm as its readers apply it (training: the batch statistics it saved).
  UnitNorm unit_norm(const Graph::Impl& g, bool training) const;
  bool loads_normalised(std::size_t k, bool) const override { return k == 0; }

  void declare(Uses& u, bool training) override;
  void plan(Graph::Impl& g) override;
  void forward(Graph::Impl& g, Stream& s, bool training) override;
  void backward(Graph::Impl& g, Stream& s) override;
  bool recomputes_output() const override { return stored; }
  void declare_recompute(Uses& u) override;
  void recompute(Graph::Impl& g, Stream& s) override;
  std::int64_t macs() const override { return mac_count; }
  bool probes_itself() const override { return true; }
  std::int64_t cin = 0, mac_count = 0;
  std::string name;
  LayerInfo info() const override;

 private:
  void declare_fused(Uses& u, bool training);
  void forward_fused(Graph::Impl& g, Stream& s, bool training);
  void backward_fused(Graph::Impl& g, Stream& s);
  // The convolution's input: the value, or the producing unit's z where it is loaded normalised.
  void reads_input(Uses& u, bool training);
  Tensor input(const Graph::Impl& g) const;
};

}  // namespace stepbench
