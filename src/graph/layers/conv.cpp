// The conv layer: a convolution without batch norm, with a bias and the ReLU after it where its spec
// says (VGG's and AlexNet's Conv2d(bias=True) -> ReLU: BiasActOp in place on the output), or alone
// (DenseNet's convolutions after their BN + ReLU), and its builder call Graph::conv. Backward
// overwrites the output's gradient with the masked one (its producer, this layer, is its last reader).
// The output's slice of a concat is made through a dense copy (the cpu convolution takes dense
// tensors).
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"
#include "graph/liveness.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

struct ConvLayer final : Layer {
  ConvParams p;
  ConvSpec spec;
  std::string name;
  std::size_t w = 0, b = 0;
  std::int64_t mac_count = 0;
  std::unique_ptr<ConvOp> conv;
  std::unique_ptr<BiasActOp> bias;
  // An output that is a concat's channel slice (DenseNet's new features): the convolution writes the
  // dense z and it is copied into the slice; backward copies the slice's gradient into the dense dz.
  const Graph::Impl* graph = nullptr;
  bool into_slice = false;  // decided at declare(): concat() may come after the layer
  TensorDesc zdesc;
  Slot ws_fwd, ws_bwd, z, dz;
  bool has_bias() const { return !spec.bias.empty(); }
  const char* act_part(bool fwd) const {
    return spec.relu ? (fwd ? "bias_relu_fwd" : "bias_relu_bwd") : (fwd ? "bias_fwd" : "bias_bwd");
  }
  void declare(Uses& u, bool training) override {
    into_slice = graph->values[out].root >= 0;
    z.size = dz.size = into_slice ? zdesc.bytes() : 0;
    u.forward("conv_fwd").reads(in[0]).writes(out).scratch(ws_fwd, "workspace");
    if (into_slice) u.scratch(z, "z");
    if (has_bias()) u.forward(act_part(true)).reads(out).writes(out);
    if (!training) return;
    if (into_slice) u.backward("grad_gather").reads_grad(out).writes(dz, "dz");
    if (has_bias()) {
      u.backward(act_part(false));
      if (into_slice)
        u.reads(dz, "dz").writes(dz, "dz");
      else
        u.reads_grad(out).writes_grad(out, 1.0f);  // in place on the output's gradient
      if (spec.relu) u.reads(out);                 // the mask
    }
    u.backward("conv_bwd_filter").reads(in[0]).reads_grad(out).scratch(ws_bwd, "backward workspace");
    if (into_slice) u.reads(dz, "dz");
    if (u.needs_grad(in[0])) {
      u.backward("conv_bwd_data").reads_grad(out).writes_grad(in[0], in_beta[0]).scratch(ws_bwd, "backward workspace");
      if (into_slice) u.reads(dz, "dz");
    }
  }
  void plan(Graph::Impl& g) override {
    const Value &x = g.values[in[0]], &y = g.values[out];
    const auto& storage = g.params[w].storage;
    const TensorDesc& yd = into_slice ? zdesc : y.t.desc;
    conv = with_fault(storage ? g.be.make_conv_stored(x.t.desc, yd, p, *storage) : g.be.make_conv(x.t.desc, yd, p),
                      x.shape, y.shape.c, p, g.slow_conv);
    if (has_bias()) bias = g.be.make_bias_act(y.t.desc, spec.relu);
    ws_fwd.size = ws_bwd.size = conv->workspace_bytes();
  }
  void forward(Graph::Impl& g, Stream& s, bool) override {
    const Tensor& y = g.values[out].t;
    {
      ProbeScope ps(g, s, "conv_fwd");
      const Tensor zt = into_slice ? Tensor{z.get(), zdesc} : y;
      conv->forward(s, g.values[in[0]].t, g.wdata(w), zt, ws_fwd.get());
      if (into_slice) g.be.add(s, zt, y, 0.0f);
    }
    if (!bias) return;
    ProbeScope ps(g, s, act_part(true));
    bias->forward(s, y, g.pdata(b));
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &x = g.values[in[0]], &y = g.values[out];
    const Tensor dyt = into_slice ? Tensor{dz.get(), zdesc} : y.g;
    if (into_slice) {
      ProbeScope ps(g, s, "grad_gather");
      g.be.add(s, y.g, dyt, 0.0f);
    }
    if (bias) {
      ProbeScope ps(g, s, act_part(false));
      bias->backward(s, y.t, dyt, dyt, 0.0f, g.pgrad(b));
    }
    {
      ProbeScope ps(g, s, "conv_bwd_filter");
      conv->backward_filter(s, x.t, dyt, g.wgrad(w), ws_bwd.get());
      g.widen_grad(s, w);
    }
    if (x.needs_grad) {
      ProbeScope ps(g, s, "conv_bwd_data");
      conv->backward_data(s, dyt, g.wdata(w), x.g, in_beta[0], ws_bwd.get());
    }
  }
  bool probes_itself() const override { return true; }
  std::int64_t macs() const override { return mac_count; }
  LayerInfo info() const override {
    auto i = base_info("conv", name);
    i.conv = p;
    i.weight = spec.weight;
    if (conv) i.conv_algorithm = conv->algorithm();
    if (bias) i.implementation = spec.relu ? "bias + ReLU" : "bias";
    return i;
  }
};

}  // namespace

ValueId Graph::conv(const std::string& name, ValueId x, std::int64_t cout, const ConvParams& p, const ConvSpec& spec) {
  auto& g = *impl_;
  SB_CHECK(
      spec.init == ParamInit::normal || spec.init == ParamInit::trunc_normal || spec.init == ParamInit::uniform_fan_in,
      fmt::format("{}: a convolution's weight is initialised from a normal or nn.Conv2d's uniform", name));
  SB_CHECK(!spec.relu || !spec.bias.empty(), fmt::format("{}: the ReLU after a convolution goes with its bias", name));
  const Shape xs = g.values.at(x).shape;
  const Shape ys = conv_output_shape(xs, cout, p);
  auto l = std::make_unique<ConvLayer>();
  l->p = p;
  l->spec = spec;
  l->name = name;
  l->graph = &g;
  l->zdesc = g.desc(ys);
  const std::int64_t cin = xs.c / p.groups;  // each output channel's inputs (conv_output_shape checked the split)
  l->mac_count = ys.numel() * p.kh * p.kw * cin;
  const std::int64_t fan_in = cin * p.kh * p.kw;
  ParamEntry w{spec.weight, {cout, cin, p.kh, p.kw}};
  w.is_filter = true;
  w.format = g.be.filter_format(g.cfg.layout);
  w.storage = g.be.conv_filter_storage(g.desc(xs), g.desc(ys), p);
  w.init = spec.init;
  w.init_std = spec.init_std;
  w.fan_in = fan_in;
  l->w = g.add_param(w);
  l->trainable = {l->w};
  if (!spec.bias.empty()) {
    ParamEntry b{spec.bias, {cout}};
    b.init = spec.bias_init;
    b.fan_in = fan_in;
    l->b = g.add_param(b);
    l->trainable.push_back(l->b);
  }
  l->in = {x};
  l->out = g.new_value(ys, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

}  // namespace stepbench
