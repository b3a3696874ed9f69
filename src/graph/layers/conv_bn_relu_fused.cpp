// The conv_bn_relu layer as a fused unit (GraphConfig::fuse; the pieces in backend/fused.hpp): the
// convolution loads its input plain or through the producing unit's batch norm (in_unit[0], whose z,
// saved statistics and reserve it then reads instead of a stored value), the batch norm is a finalize
// (and, where the output is stored, its apply), and backward makes the ReLU's mask from z where the
// output is not stored.
#include <fmt/format.h>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/conv_bn_relu.hpp"
#include "graph/liveness.hpp"

namespace stepbench {

UnitNorm ConvBnReluLayer::unit_norm(const Graph::Impl& g, bool training) const {
  UnitNorm n;
  n.op = bnu.get();
  n.training = training;
  n.gamma = g.pdata(gamma);
  n.beta = g.pdata(beta);
  n.save_mean = saved.as<float>();
  n.save_invstd = n.save_mean ? n.save_mean + cout : nullptr;
  n.running_mean = g.pdata(rmean);
  n.running_var = g.pdata(rvar);
  n.reserve = bn_reserve.get();
  n.norm = norm.get();
  return n;
}

// A unit's buffers that its readers' loads read (training: the batch statistics; inference: only the
// running ones, which the graph keeps)
void ConvBnReluLayer::reads_input(Uses& u, bool training) {
  ConvBnReluLayer* from = unit_at(0);
  if (!from) {
    u.reads(in[0]);
    return;
  }
  u.reads(from->z, "z");
  if (training)
    u.reads(from->saved, "batch statistics").reads(from->bn_reserve, "bn reserve").reads(from->norm, "bn factors");
}

Tensor ConvBnReluLayer::input(const Graph::Impl& g) const {
  const ConvBnReluLayer* from = unit_at(0);
  return from ? Tensor{from->z.get(), from->zdesc} : g.values[in[0]].t;
}

void ConvBnReluLayer::declare_fused(Uses& u, bool training) {
  const char* apply = spec.relu ? "bn_relu_fwd" : "bn_fwd";
  u.forward("conv_fwd");
  reads_input(u, training);
  u.writes(z, "z").writes(stats, "statistics").scratch(ws_fwd, "workspace");
  if (stored) {
    u.forward(apply).reads(z, "z").reads(stats, "statistics").writes(out).scratch(ws_fwd, "workspace");
    if (training) u.writes(saved, "batch statistics").writes(bn_reserve, "bn reserve").writes(norm, "bn factors");
  } else if (training) {  // the statistics and factors only: the readers apply them
    u.forward("bn_stats").reads(z, "z").reads(stats, "statistics").writes(saved, "batch statistics");
    u.writes(bn_reserve, "bn reserve").writes(norm, "bn factors").scratch(ws_fwd, "workspace");
  }
  if (!training) return;
  u.backward(spec.relu ? "bn_relu_bwd" : "bn_bwd").reads(z, "z").reads_grad(out).reads(saved, "batch statistics");
  if (stored && spec.relu) u.reads(out);  // the ReLU's mask; not stored: made again from z
  u.reads(bn_reserve, "bn reserve").reads(norm, "bn factors").writes(dz, "dz").scratch(ws_bwd, "backward workspace");
  u.backward("conv_bwd_filter");
  reads_input(u, true);
  u.reads(dz, "dz").scratch(ws_bwd, "backward workspace");
  if (u.needs_grad(in[0]))
    u.backward("conv_bwd_data").reads(dz, "dz").writes_grad(in[0], in_beta[0]).scratch(ws_bwd, "backward workspace");
}

void ConvBnReluLayer::forward_fused(Graph::Impl& g, Stream& s, bool training) {
  const Tensor zt{z.get(), zdesc};
  const ConvBnReluLayer* from = unit_at(0);
  const UnitNorm in_norm = from ? from->unit_norm(g, training) : UnitNorm{};
  {
    ProbeScope ps(g, s, "conv_fwd");
    fconv->forward(s, input(g), from ? &in_norm : nullptr, g.wdata(w), zt, stats.get(), ws_fwd.get());
  }
  if (!stored && !training) return;  // the readers apply the running statistics
  ProbeScope ps(g, s, stored ? (spec.relu ? "bn_relu_fwd" : "bn_fwd") : "bn_stats");
  if (training)
    bnu->finalize(s, zt, fconv->makes_statistics() ? stats.get() : nullptr, g.pdata(gamma), g.pdata(beta),
                  g.pdata(rmean), g.pdata(rvar), saved.as<float>(), saved.as<float>() + cout, norm.get(),
                  stored ? g.values[out].t : Tensor{}, ws_fwd.get(), bn_reserve.get());
  else
    bnu->apply(s, zt, unit_norm(g, false), g.values[out].t, ws_fwd.get());
}

void ConvBnReluLayer::backward_fused(Graph::Impl& g, Stream& s) {
  const Tensor zt{z.get(), zdesc}, dzt{dz.get(), zdesc};
  const Value& o = g.values[out];
  {
    ProbeScope ps(g, s, spec.relu ? "bn_relu_bwd" : "bn_bwd");
    bnu->backward(s, zt, unit_norm(g, true), stored ? o.t : Tensor{}, o.g, dzt, g.pgrad(gamma), g.pgrad(beta),
                  ws_bwd.get());
  }
  const ConvBnReluLayer* from = unit_at(0);
  {
    ProbeScope ps(g, s, "conv_bwd_filter");
    const UnitNorm in_norm = from ? from->unit_norm(g, true) : UnitNorm{};
    fconv->backward_filter(s, input(g), from ? &in_norm : nullptr, dzt, g.wgrad(w), ws_bwd.get());
    g.widen_grad(s, w);
  }
  if (g.values[in[0]].needs_grad) {
    ProbeScope ps(g, s, "conv_bwd_data");
    fconv->backward_data(s, dzt, g.wdata(w), g.values[in[0]].g, in_beta[0], ws_bwd.get());
  }
}

}  // namespace stepbench
