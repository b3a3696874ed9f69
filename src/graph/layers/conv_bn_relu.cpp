// The conv_bn_relu layer (declared in conv_bn_relu.hpp) and its builder calls: Graph::conv_bn, which
// registers its parameters under the names its ConvBnSpec gives, and Graph::conv_bn_relu, which names
// them as torchvision's BasicConv2d: <name>.conv.weight and <name>.bn.{weight,bias,running_mean,running_var}.
#include "graph/layers/conv_bn_relu.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"

namespace stepbench {

void ConvBnReluLayer::plan(Graph::Impl& g) {
  const Value& x = g.values[in[0]];
  zdesc = g.desc(g.values[out].shape);
  const auto& storage = g.params[w].storage;
  conv = with_fault(
      storage ? g.be.make_conv_stored(g.desc(x.shape), zdesc, p, *storage) : g.be.make_conv(g.desc(x.shape), zdesc, p),
      x.shape, cout, p, g.slow_conv);
  bn = g.be.make_batch_norm(zdesc, g.values[out].t.desc, BatchNormParams{spec.eps, 0.1, spec.relu});
  g.reserve(z, zdesc.bytes());
  g.reserve(saved, 2 * sizeof(float) * static_cast<std::size_t>(cout));
  g.reserve(bn_reserve, bn->reserve_bytes());
}

void ConvBnReluLayer::forward(Graph::Impl& g, Stream& s, bool training) {
  const Tensor zt{z.get(), zdesc};
  {
    ProbeScope ps(g, s, "conv_fwd");
    conv->forward(s, g.values[in[0]].t, g.wdata(w), zt, g.workspace.get());
  }
  ProbeScope ps(g, s, spec.relu ? "bn_relu_fwd" : "bn_fwd");
  if (training)
    bn->forward_training(s, zt, g.values[out].t, g.pdata(gamma), g.pdata(beta), g.pdata(rmean), g.pdata(rvar),
                         saved.as<float>(), saved.as<float>() + cout, g.workspace.get(), bn_reserve.get());
  else
    bn->forward_inference(s, zt, g.values[out].t, g.pdata(gamma), g.pdata(beta), g.pdata(rmean), g.pdata(rvar),
                          g.workspace.get());
}

void ConvBnReluLayer::backward(Graph::Impl& g, Stream& s) {
  const Tensor zt{z.get(), zdesc}, dz{g.scratch.get(), zdesc};
  const Value& o = g.values[out];
  {
    ProbeScope ps(g, s, spec.relu ? "bn_relu_bwd" : "bn_bwd");
    bn->backward(s, zt, o.t, o.g, dz, g.pdata(gamma), g.pdata(beta), saved.as<float>(), saved.as<float>() + cout,
                 g.pgrad(gamma), g.pgrad(beta), 0.0f, g.workspace.get(), bn_reserve.get());
  }
  {
    ProbeScope ps(g, s, "conv_bwd_filter");
    conv->backward_filter(s, g.values[in[0]].t, dz, g.wgrad(w), g.workspace.get());
    g.widen_grad(s, w);
  }
  if (g.values[in[0]].needs_grad) {
    ProbeScope ps(g, s, "conv_bwd_data");
    conv->backward_data(s, dz, g.wdata(w), g.values[in[0]].g, in_beta[0], g.workspace.get());
  }
}

std::size_t ConvBnReluLayer::workspace_bytes() const {
  return std::max(conv->workspace_bytes(), bn->workspace_bytes());
}

LayerInfo ConvBnReluLayer::info() const {
  auto i = base_info(spec.relu ? "conv_bn_relu" : "conv_bn", name);
  i.conv = p;
  i.weight = spec.weight;
  i.bn = spec.bn;
  i.bn_eps = spec.eps;
  if (conv) i.conv_algorithm = conv->algorithm();
  if (bn) i.implementation = bn->implementation();
  return i;
}

ValueId Graph::conv_bn_relu(const std::string& name, ValueId x, std::int64_t cout, const ConvParams& p,
                            float init_std) {
  return conv_bn(name, x, cout, p,
                 {name + ".conv.weight", name + ".bn", true, 1e-3, ParamInit::trunc_normal, init_std});
}

ValueId Graph::conv_bn(const std::string& name, ValueId x, std::int64_t cout, const ConvParams& p,
                       const ConvBnSpec& spec) {
  auto& g = *impl_;
  SB_CHECK(spec.init == ParamInit::trunc_normal || spec.init == ParamInit::normal,
           fmt::format("{}: a convolution's weight is initialised from a (truncated) normal", name));
  const Shape xs = g.values.at(x).shape;
  const Shape ys = conv_output_shape(xs, cout, p);
  auto l = std::make_unique<ConvBnReluLayer>();
  l->p = p;
  l->spec = spec;
  l->name = name;
  l->cout = cout;
  l->cin = xs.c;
  l->mac_count = ys.numel() * p.kh * p.kw * xs.c;
  ParamEntry w{spec.weight, {cout, xs.c, p.kh, p.kw}};
  w.is_filter = true;
  w.format = g.be.filter_format(g.cfg.layout);
  // the backend's own format where its convolution runs faster on it (oneDNN's blocked weights):
  // kept there by the arenas, so the convolution reorders no filter per call
  w.storage = g.be.conv_filter_storage(g.desc(xs), g.desc(ys), p);
  w.init = spec.init;
  w.init_std = spec.init_std;
  l->w = g.add_param(w);
  const std::string& b = spec.bn;
  l->gamma = g.add_param({b + ".weight", {cout}, 0, 0, true, false, FilterFormat::oihw, ParamInit::ones});
  l->beta = g.add_param({b + ".bias", {cout}});
  l->trainable = {l->w, l->gamma, l->beta};
  l->rmean = g.add_param({b + ".running_mean", {cout}, 0, 0, false});
  l->rvar = g.add_param({b + ".running_var", {cout}, 0, 0, false, false, FilterFormat::oihw, ParamInit::ones});
  l->in = {x};
  l->out = g.new_value(ys, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

}  // namespace stepbench
