// The batch_norm layer: BatchNorm2d and the ReLU after it, alone (DenseNet's pre-activation: norm ->
// relu -> conv, whose input is a prefix of its block's concatenation; its norm5 before the
// classifier), and its builder call Graph::batch_norm. Backward can make the output again from the
// input and the batch statistics it keeps anyway (GraphConfig::recompute): the memory-efficient
// DenseNet's trade, one elementwise pass for the normalised copy of every prefix.
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

struct BatchNormLayer final : Layer {
  BnSpec spec;
  std::int64_t c = 0;
  std::size_t gamma = 0, beta = 0, rmean = 0, rvar = 0;
  std::unique_ptr<BatchNormOp> bn;
  Slot saved, reserve, ws;
  enum Piece { kFwd, kBwd, kRecompute };
  const char* part(Piece k) const {
    static constexpr const char* kNames[2][3] = {{"bn_fwd", "bn_bwd", "bn_recompute"},
                                                 {"bn_relu_fwd", "bn_relu_bwd", "bn_relu_recompute"}};
    return kNames[spec.relu ? 1 : 0][k];
  }
  void declare(Uses& u, bool training) override {
    u.forward(part(kFwd)).reads(in[0]).writes(out).scratch(ws, "workspace");
    if (!training) return;
    u.writes(saved, "batch statistics").writes(reserve, "bn reserve");
    u.backward(part(kBwd)).reads(in[0]).reads_grad(out).reads(saved, "batch statistics");
    if (spec.relu) u.reads(out);  // the ReLU's mask
    u.reads(reserve, "bn reserve").scratch(ws, "workspace");
    if (u.needs_grad(in[0])) u.writes_grad(in[0], in_beta[0]);
  }
  void plan(Graph::Impl& g) override {
    bn = g.be.make_batch_norm(g.values[in[0]].t.desc, g.values[out].t.desc, {spec.eps, 0.1, spec.relu});
    reserve.size = bn->reserve_bytes();
    ws.size = bn->workspace_bytes();
  }
  void forward(Graph::Impl& g, Stream& s, bool training) override {
    ProbeScope ps(g, s, part(kFwd));
    const Tensor &x = g.values[in[0]].t, &y = g.values[out].t;
    if (training)
      bn->forward_training(s, x, y, g.pdata(gamma), g.pdata(beta), g.pdata(rmean), g.pdata(rvar), saved.as<float>(),
                           saved.as<float>() + c, ws.get(), reserve.get());
    else
      bn->forward_inference(s, x, y, g.pdata(gamma), g.pdata(beta), g.pdata(rmean), g.pdata(rvar), ws.get());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    ProbeScope ps(g, s, part(kBwd));
    const Value &x = g.values[in[0]], &y = g.values[out];
    bn->backward(s, x.t, y.t, y.g, x.g, g.pdata(gamma), g.pdata(beta), saved.as<float>(), saved.as<float>() + c,
                 g.pgrad(gamma), g.pgrad(beta), in_beta[0], ws.get(), reserve.get());
  }
  bool recomputes_output() const override { return true; }
  void declare_recompute(Uses& u) override {
    u.backward(part(kRecompute))
        .reads(in[0])
        .reads(saved, "batch statistics")
        .reads(reserve, "bn reserve")
        .writes(out)
        .scratch(ws, "workspace");
  }
  void recompute(Graph::Impl& g, Stream& s) override {
    ProbeScope ps(g, s, part(kRecompute));
    bn->forward_recompute(s, g.values[in[0]].t, g.values[out].t, g.pdata(gamma), g.pdata(beta), saved.as<float>(),
                          saved.as<float>() + c, ws.get(), reserve.get());
  }
  bool probes_itself() const override { return true; }
  std::string name;
  LayerInfo info() const override {
    auto i = base_info(spec.relu ? "bn_relu" : "bn", name);
    i.bn = spec.prefix;
    i.bn_eps = spec.eps;
    if (bn) i.implementation = bn->implementation();
    return i;
  }
};

}  // namespace

ValueId Graph::batch_norm(const std::string& name, ValueId x, const BnSpec& spec) {
  auto& g = *impl_;
  SB_CHECK(g.values.at(x).needs_grad, fmt::format("{}: batch norm of a value without a gradient (the input)", name));
  const Shape xs = g.values.at(x).shape;
  auto l = std::make_unique<BatchNormLayer>();
  l->spec = spec;
  l->name = name;
  l->c = xs.c;
  const std::string& b = spec.prefix;
  l->gamma = g.add_param({b + ".weight", {xs.c}, 0, 0, true, false, FilterFormat::oihw, ParamInit::ones});
  l->beta = g.add_param({b + ".bias", {xs.c}});
  l->trainable = {l->gamma, l->beta};
  l->rmean = g.add_param({b + ".running_mean", {xs.c}, 0, 0, false});
  l->rvar = g.add_param({b + ".running_var", {xs.c}, 0, 0, false, false, FilterFormat::oihw, ParamInit::ones});
  l->saved.size = 2 * sizeof(float) * static_cast<std::size_t>(xs.c);
  l->in = {x};
  l->out = g.new_value(xs, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

}  // namespace stepbench
