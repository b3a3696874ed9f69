// The pool layer (max or average pooling, PoolParams) and its builder calls Graph::pool and
// Graph::global_avg_pool.
#include <memory>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"
#include "graph/liveness.hpp"

namespace stepbench {
namespace {

struct PoolLayer final : Layer {
  PoolParams p;
  std::unique_ptr<PoolOp> op;
  Slot reserve;  // max pooling's argmax, where the op keeps it
  void declare(Uses& u, bool training) override {
    u.forward("fwd").reads(in[0]).writes(out).writes(reserve, "indices");
    if (!training) return;
    u.backward("bwd");
    if (u.needs_grad(in[0]))
      u.reads(in[0]).reads(out).reads_grad(out).reads(reserve, "indices").writes_grad(in[0], in_beta[0]);
  }
  void plan(Graph::Impl& g) override {
    op = g.be.make_pool(g.values[in[0]].t.desc, g.values[out].t.desc, p);
    reserve.size = op->reserve_bytes();
  }
  void forward(Graph::Impl& g, Stream& s, bool) override {
    op->forward(s, g.values[in[0]].t, g.values[out].t, reserve.get());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &x = g.values[in[0]], &y = g.values[out];
    if (x.needs_grad) op->backward(s, x.t, y.t, y.g, x.g, in_beta[0], reserve.get());
  }
  LayerInfo info() const override {
    auto i = base_info("pool");
    i.pool = p;
    if (op) i.implementation = op->implementation();
    return i;
  }
};

}  // namespace

ValueId Graph::pool(ValueId x, const PoolParams& p, const std::string& label) {
  auto& g = *impl_;
  auto l = std::make_unique<PoolLayer>();
  l->p = p;
  l->label = label;
  l->in = {x};
  l->out = g.new_value(pool_output_shape(g.values.at(x).shape, p), static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

ValueId Graph::global_avg_pool(ValueId x, const std::string& label) {
  const Shape s = impl_->values.at(x).shape;
  return pool(x, PoolParams{PoolKind::avg_include_pad, static_cast<int>(s.h), static_cast<int>(s.w), 1, 1, 0, 0},
              label);
}

}  // namespace stepbench
