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
#include "graph/liveness.hpp"

namespace stepbench {

void ConvBnReluLayer::declare(Uses& u, bool training) {
  if (fused) return declare_fused(u, training);
  const ValueId x = in[0];
  u.forward("conv_fwd").reads(x).writes(z, "z").scratch(ws_fwd, "workspace");
  u.forward(spec.relu ? "bn_relu_fwd" : "bn_fwd").reads(z, "z").writes(out).scratch(ws_fwd, "workspace");
  if (!training) return;
  u.writes(saved, "batch statistics").writes(bn_reserve, "bn reserve");
  u.backward(spec.relu ? "bn_relu_bwd" : "bn_bwd").reads(z, "z").reads_grad(out).reads(saved, "batch statistics");
  if (spec.relu) u.reads(out);  // the ReLU's mask (without the ReLU no backend reads y)
  u.reads(bn_reserve, "bn reserve").writes(dz, "dz").scratch(ws_bwd, "backward workspace");
  u.backward("conv_bwd_filter").reads(x).reads(dz, "dz").scratch(ws_bwd, "backward workspace");
  if (u.needs_grad(x))
    u.backward("conv_bwd_data").reads(dz, "dz").writes_grad(x, in_beta[0]).scratch(ws_bwd, "backward workspace");
}

void ConvBnReluLayer::plan(Graph::Impl& g) {
  const Value& x = g.values[in[0]];
  const auto& storage = g.params[w].storage;
  if (fused) {
    ConvBnReluLayer* from = unit_at(0);
    SB_CHECK(!from || from->bnu, fmt::format("{}: the unit it loads is planned after it", name));
    // not stored: what finalize and a reader's load write is dense, as z
    bnu = g.be.make_bn_unit(zdesc, stored ? g.values[out].t.desc : zdesc,
                            {BatchNormParams{spec.eps, 0.1, spec.relu}, stored});
    fconv = with_fault(
        g.be.make_fused_conv(g.desc(x.shape), zdesc, {p, from ? from->bnu.get() : nullptr, bnu.get()}, storage.get()),
        x.shape, cout, p, g.slow_conv);
    SB_CHECK(!fconv->makes_statistics() || bnu->stats_bytes() > 0,
             fmt::format("{}: the convolution makes statistics its unit keeps no room for", name));
    bn_reserve.size = bnu->reserve_bytes();
    stats.size = bnu->stats_bytes();
    norm.size = bnu->norm_bytes();
    ws_fwd.size = std::max({fconv->workspace_bytes(), bnu->workspace_bytes(), bnu->apply_workspace_bytes()});
    ws_bwd.size = ws_fwd.size;
    return;
  }
  conv = with_fault(
      storage ? g.be.make_conv_stored(g.desc(x.shape), zdesc, p, *storage) : g.be.make_conv(g.desc(x.shape), zdesc, p),
      x.shape, cout, p, g.slow_conv);
  bn = g.be.make_batch_norm(zdesc, g.values[out].t.desc, BatchNormParams{spec.eps, 0.1, spec.relu});
  bn_reserve.size = bn->reserve_bytes();
  ws_fwd.size = std::max(conv->workspace_bytes(), bn->workspace_bytes());
  ws_bwd.size = ws_fwd.size;
}

void ConvBnReluLayer::forward(Graph::Impl& g, Stream& s, bool training) {
  if (fused) return forward_fused(g, s, training);
  const Tensor zt{z.get(), zdesc};
  {
    ProbeScope ps(g, s, "conv_fwd");
    conv->forward(s, g.values[in[0]].t, g.wdata(w), zt, ws_fwd.get());
  }
  ProbeScope ps(g, s, spec.relu ? "bn_relu_fwd" : "bn_fwd");
  if (training)
    bn->forward_training(s, zt, g.values[out].t, g.pdata(gamma), g.pdata(beta), g.pdata(rmean), g.pdata(rvar),
                         saved.as<float>(), saved.as<float>() + cout, ws_fwd.get(), bn_reserve.get());
  else
    bn->forward_inference(s, zt, g.values[out].t, g.pdata(gamma), g.pdata(beta), g.pdata(rmean), g.pdata(rvar),
                          ws_fwd.get());
}

void ConvBnReluLayer::backward(Graph::Impl& g, Stream& s) {
  if (fused) return backward_fused(g, s);
  const Tensor zt{z.get(), zdesc}, dzt{dz.get(), zdesc};
  const Value& o = g.values[out];
  {
    ProbeScope ps(g, s, spec.relu ? "bn_relu_bwd" : "bn_bwd");
    bn->backward(s, zt, o.t, o.g, dzt, g.pdata(gamma), g.pdata(beta), saved.as<float>(), saved.as<float>() + cout,
                 g.pgrad(gamma), g.pgrad(beta), 0.0f, ws_bwd.get(), bn_reserve.get());
  }
  {
    ProbeScope ps(g, s, "conv_bwd_filter");
    conv->backward_filter(s, g.values[in[0]].t, dzt, g.wgrad(w), ws_bwd.get());
    g.widen_grad(s, w);
  }
  if (g.values[in[0]].needs_grad) {
    ProbeScope ps(g, s, "conv_bwd_data");
    conv->backward_data(s, dzt, g.wdata(w), g.values[in[0]].g, in_beta[0], ws_bwd.get());
  }
}

void ConvBnReluLayer::declare_recompute(Uses& u) {
  u.backward(spec.relu ? "bn_relu_recompute" : "bn_recompute")
      .reads(z, "z")
      .reads(saved, "batch statistics")
      .reads(bn_reserve, "bn reserve")
      .writes(out)
      .scratch(ws_bwd, "backward workspace");
  if (fused) u.reads(norm, "bn factors");
}

void ConvBnReluLayer::recompute(Graph::Impl& g, Stream& s) {
  ProbeScope ps(g, s, spec.relu ? "bn_relu_recompute" : "bn_recompute");
  if (fused) return bnu->apply(s, Tensor{z.get(), zdesc}, unit_norm(g, true), g.values[out].t, ws_bwd.get());
  bn->forward_recompute(s, Tensor{z.get(), zdesc}, g.values[out].t, g.pdata(gamma), g.pdata(beta), saved.as<float>(),
                        saved.as<float>() + cout, ws_bwd.get(), bn_reserve.get());
}

LayerInfo ConvBnReluLayer::info() const {
  auto i = base_info(spec.relu ? "conv_bn_relu" : "conv_bn", name);
  i.conv = p;
  i.weight = spec.weight;
  i.bn = spec.bn;
  i.bn_eps = spec.eps;
  if (conv) i.conv_algorithm = conv->algorithm();
  if (bn) i.implementation = bn->implementation();
  if (fconv) i.conv_algorithm = fconv->algorithm(), i.fused = fconv->implementation();
  if (bnu) i.implementation = bnu->implementation();
  i.stored = stored;
  i.loads = {unit_at(0) ? unit_at(0)->name : ""};
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
  l->mac_count = ys.numel() * p.kh * p.kw * (xs.c / p.groups);
  ParamEntry w{spec.weight, {cout, xs.c / p.groups, p.kh, p.kw}};  // grouped: O x I/groups x KH x KW
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
  // the buffers whose size the shapes decide (the ops size the rest in plan())
  l->zdesc = g.desc(ys);
  l->z.size = l->dz.size = l->zdesc.bytes();
  l->saved.size = 2 * sizeof(float) * static_cast<std::size_t>(cout);
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

}  // namespace stepbench
