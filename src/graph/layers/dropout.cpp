// The dropout layer (inverted dropout with probability p; a copy outside training) and its builder
// call Graph::dropout. Masks come from the graph's seed and step counter.
#include <memory>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"
#include "graph/liveness.hpp"

namespace stepbench {
namespace {

struct DropoutLayer final : Layer {
  double p;
  std::unique_ptr<DropoutOp> op;
  Slot reserve;  // the mask
  void declare(Uses& u, bool training) override {
    u.forward("fwd").reads(in[0]).writes(out);
    if (!training) return;
    u.writes(reserve, "mask");
    u.backward("bwd");
    if (u.needs_grad(in[0])) u.reads_grad(out).reads(reserve, "mask").writes_grad(in[0], in_beta[0]);
  }
  void plan(Graph::Impl& g) override {
    op = g.be.make_dropout(g.values[in[0]].t.desc, p);
    reserve.size = op->reserve_bytes();
  }
  void forward(Graph::Impl& g, Stream& s, bool training) override {
    const Tensor &x = g.values[in[0]].t, &y = g.values[out].t;
    if (training)
      op->forward(s, x, y, reserve.get(), g.cfg.seed, g.step);
    else
      g.be.copy(s, y.data, x.data, x.desc.bytes());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &x = g.values[in[0]], &y = g.values[out];
    if (x.needs_grad) op->backward(s, y.g, x.g, in_beta[0], reserve.get());
  }
  LayerInfo info() const override { return base_info("dropout"); }
};

}  // namespace

ValueId Graph::dropout(ValueId x, double p, const std::string& label) {
  auto& g = *impl_;
  auto l = std::make_unique<DropoutLayer>();
  l->p = p;
  l->label = label;
  l->in = {x};
  l->out = g.new_value(g.values.at(x).shape, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

}  // namespace stepbench
