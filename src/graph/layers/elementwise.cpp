// Layers of one elementwise pass and their builder calls: relu (ReluOp; with a clip, ReLU6), add (a
// residual connection without a ReLU: MobileNet-v2's inverted residual) and flatten (C x H x W into
// a N x CHW x 1 x 1 value in PyTorch's order, c then h then w, in both layouts, for the fully
// connected layer after it: a copy through the backend's add, which changes layout where the map is
// NHWC).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"
#include "graph/liveness.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

struct ReluLayer final : Layer {
  float clip = kNoClip;
  std::unique_ptr<ReluOp> op;
  void declare(Uses& u, bool training) override {
    u.forward("fwd").reads(in[0]).writes(out);
    if (!training) return;
    u.backward("bwd");
    if (u.needs_grad(in[0])) u.reads(out).reads_grad(out).writes_grad(in[0], in_beta[0]);
  }
  void plan(Graph::Impl& g) override { op = g.be.make_relu(g.values[in[0]].t.desc, g.values[out].t.desc, clip); }
  void forward(Graph::Impl& g, Stream& s, bool) override { op->forward(s, g.values[in[0]].t, g.values[out].t); }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &x = g.values[in[0]], &y = g.values[out];
    if (x.needs_grad) op->backward(s, y.t, y.g, x.g, in_beta[0]);
  }
  LayerInfo info() const override {
    auto i = base_info(clip == kNoClip ? "relu" : "relu6");
    i.implementation = clip == kNoClip ? "relu" : fmt::format("relu clipped at {:g}", clip);
    return i;
  }
};

struct AddLayer final : Layer {
  void declare(Uses& u, bool training) override {
    u.forward("fwd").reads(in[0]).reads(in[1]).writes(out);
    if (!training) return;
    u.backward("bwd");
    if (!u.needs_grad(in[0]) && !u.needs_grad(in[1])) return;
    u.reads_grad(out);
    for (int k : {0, 1})
      if (u.needs_grad(in[k])) u.writes_grad(in[k], in_beta[k]);
  }
  void plan(Graph::Impl&) override {}
  void forward(Graph::Impl& g, Stream& s, bool) override {
    g.be.add(s, g.values[in[0]].t, g.values[out].t, 0.0f);
    g.be.add(s, g.values[in[1]].t, g.values[out].t, 1.0f);
  }
  void backward(Graph::Impl& g, Stream& s) override {
    for (int k : {0, 1})
      if (g.values[in[k]].needs_grad) g.be.add(s, g.values[out].g, g.values[in[k]].g, in_beta[k]);
  }
  LayerInfo info() const override { return base_info("add"); }
};

struct FlattenLayer final : Layer {
  Shape xs;
  // out's buffer seen as the input's N x C x H x W, dense in NCHW order: PyTorch's flatten order
  Tensor as_map(const Tensor& t) const { return Tensor{t.data, TensorDesc::dense(xs, t.desc.dtype, Layout::nchw)}; }
  void declare(Uses& u, bool training) override {
    u.forward("fwd").reads(in[0]).writes(out);
    if (!training) return;
    u.backward("bwd");
    if (u.needs_grad(in[0])) u.reads_grad(out).writes_grad(in[0], in_beta[0]);
  }
  void plan(Graph::Impl&) override {}
  void forward(Graph::Impl& g, Stream& s, bool) override {
    g.be.add(s, g.values[in[0]].t, as_map(g.values[out].t), 0.0f);
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value& x = g.values[in[0]];
    if (x.needs_grad) g.be.add(s, as_map(g.values[out].g), x.g, in_beta[0]);
  }
  LayerInfo info() const override { return base_info("flatten"); }
};

}  // namespace

ValueId Graph::relu(ValueId x, float clip, const std::string& label) {
  auto& g = *impl_;
  SB_CHECK(clip > 0.0f, "relu: the clip must be positive (kNoClip: none)");
  auto l = std::make_unique<ReluLayer>();
  l->clip = clip;
  l->label = label;
  l->in = {x};
  l->out = g.new_value(g.values.at(x).shape, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

ValueId Graph::add(ValueId a, ValueId b, const std::string& label) {
  auto& g = *impl_;
  const Shape as = g.values.at(a).shape, bs = g.values.at(b).shape;
  SB_CHECK(a != b, "add: a value added to itself (its gradient would be written twice at once)");
  SB_CHECK(as == bs, fmt::format("add: {} and {} differ", to_string(as), to_string(bs)));
  auto l = std::make_unique<AddLayer>();
  l->label = label;
  l->in = {a, b};
  l->out = g.new_value(as, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

ValueId Graph::flatten(ValueId x, const std::string& label) {
  auto& g = *impl_;
  const Shape xs = g.values.at(x).shape;
  auto l = std::make_unique<FlattenLayer>();
  l->xs = xs;
  l->label = label;
  l->in = {x};
  l->out = g.new_value({xs.n, xs.c * xs.h * xs.w, 1, 1}, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

}  // namespace stepbench
