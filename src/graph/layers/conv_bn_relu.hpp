// The conv_bn_relu layer: torchvision's BasicConv2d (Conv2d without bias -> BatchNorm2d -> ReLU), and
// without the ReLU (kind conv_bn: the last convolution of a ResNet bottleneck, its downsample).
// Declared here rather than only in conv_bn_relu.cpp because planning's estimate (plan.cpp) counts
// its pre-norm convolution output z, which no value owns.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"

namespace stepbench {

struct ConvBnReluLayer final : Layer {
  ConvParams p;
  ConvBnSpec spec;  // parameter names, eps, the ReLU
  std::int64_t cout;
  std::size_t w, gamma, beta, rmean, rvar;
  // conv output (dense), saved mean + invstd, what the BN op keeps; the gradient at z (backward
  // only); the workspace of the forward's and of the backward's pieces
  Slot z, saved, bn_reserve, dz, ws_fwd, ws_bwd;
  std::unique_ptr<ConvOp> conv;
  std::unique_ptr<BatchNormOp> bn;
  TensorDesc zdesc;

  void declare(Uses& u, bool training) override;
  void plan(Graph::Impl& g) override;
  void forward(Graph::Impl& g, Stream& s, bool training) override;
  void backward(Graph::Impl& g, Stream& s) override;
  bool recomputes_output() const override { return true; }
  void declare_recompute(Uses& u) override;
  void recompute(Graph::Impl& g, Stream& s) override;
  std::int64_t macs() const override { return mac_count; }
  bool probes_itself() const override { return true; }
  std::int64_t cin = 0, mac_count = 0;
  std::string name;
  LayerInfo info() const override;
};

}  // namespace stepbench
