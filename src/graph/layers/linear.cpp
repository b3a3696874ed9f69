// The linear layer (fully connected, with bias, over a flattened N x C x 1 x 1 input) and its
// builder call Graph::linear, which registers <name>.weight and <name>.bias.
#include <cstdint>
#include <memory>
#include <string>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"
#include "graph/liveness.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

struct LinearLayer final : Layer {
  std::size_t w, b;
  std::unique_ptr<LinearOp> op;
  std::int64_t k = 0, m = 0;
  Slot ws_fwd, ws_bwd;
  void declare(Uses& u, bool training) override {
    u.forward("fwd").reads(in[0]).writes(out).scratch(ws_fwd, "workspace");
    if (!training) return;
    u.backward("bwd").reads(in[0]).reads_grad(out).scratch(ws_bwd, "backward workspace");
    if (u.needs_grad(in[0])) u.writes_grad(in[0], in_beta[0]);
  }
  void plan(Graph::Impl& g) override {
    op = g.be.make_linear(g.values[in[0]].t.desc, g.values[out].t.desc);
    ws_fwd.size = ws_bwd.size = op->workspace_bytes();
  }
  void forward(Graph::Impl& g, Stream& s, bool) override {
    op->forward(s, g.values[in[0]].t, g.wdata(w), g.wdata(b), g.values[out].t, ws_fwd.get());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &x = g.values[in[0]], &y = g.values[out];
    op->backward_weights(s, x.t, y.g, g.wgrad(w), g.wgrad(b), ws_bwd.get());
    g.widen_grad(s, w);
    g.widen_grad(s, b);
    if (x.needs_grad) op->backward_data(s, y.g, g.wdata(w), x.g, in_beta[0], ws_bwd.get());
  }
  std::int64_t macs() const override { return k * m * batch; }
  std::int64_t batch = 0;
  std::string name;
  LayerInfo info() const override {
    LayerInfo i = base_info("linear", name);
    if (op) i.implementation = op->implementation();
    return i;
  }
};

}  // namespace

ValueId Graph::linear(const std::string& name, ValueId x, std::int64_t out, float init_std, ParamInit weight_init,
                      ParamInit bias_init) {
  auto& g = *impl_;
  const Shape xs = g.values.at(x).shape;
  SB_CHECK(xs.h == 1 && xs.w == 1, "linear needs a N x C x 1 x 1 input (pool first)");
  auto l = std::make_unique<LinearLayer>();
  l->name = name;
  l->k = xs.c;
  l->m = out;
  l->batch = xs.n;
  ParamEntry w{name + ".weight", {out, xs.c}};
  SB_CHECK(weight_init == ParamInit::trunc_normal || weight_init == ParamInit::uniform_fan_in ||
               weight_init == ParamInit::normal,
           "linear: the weight is initialised from a (truncated) normal or nn.Linear's uniform");
  SB_CHECK(bias_init == ParamInit::uniform_fan_in || bias_init == ParamInit::zeros,
           "linear: the bias is initialised as nn.Linear's or zero");
  w.init = weight_init;
  w.init_std = init_std;
  w.fan_in = xs.c;
  l->w = g.add_param(w);
  ParamEntry b{name + ".bias", {out}};
  b.init = bias_init;
  b.fan_in = xs.c;
  l->b = g.add_param(b);
  l->trainable = {l->w, l->b};
  l->in = {x};
  l->out = g.new_value({xs.n, out, 1, 1}, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

}  // namespace stepbench
