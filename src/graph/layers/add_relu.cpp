// The add_relu layer (a residual connection: relu(a + b), fused) and its builder call Graph::add_relu.
// Backward sends one masked gradient to both inputs; planning's fan-out decides, per input, whether
// it overwrites the input's gradient or adds to it (the block input also feeds the first convolution).
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

struct AddReluLayer final : Layer {
  std::unique_ptr<AddReluOp> op;
  void declare(Uses& u, bool training) override {
    u.forward("fwd").reads(in[0]).reads(in[1]).writes(out);
    if (!training) return;
    u.backward("bwd");
    if (!u.needs_grad(in[0]) && !u.needs_grad(in[1])) return;
    u.reads(out).reads_grad(out);  // the mask: where the output is positive
    for (int k : {0, 1})
      if (u.needs_grad(in[k])) u.writes_grad(in[k], in_beta[k]);
  }
  void plan(Graph::Impl& g) override { op = g.be.make_add_relu(g.values[out].t.desc); }
  void forward(Graph::Impl& g, Stream& s, bool) override {
    op->forward(s, g.values[in[0]].t, g.values[in[1]].t, g.values[out].t);
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &a = g.values[in[0]], &b = g.values[in[1]], &y = g.values[out];
    op->backward(s, y.t, y.g, a.needs_grad ? a.g : Tensor{}, in_beta[0], b.needs_grad ? b.g : Tensor{}, in_beta[1]);
  }
  LayerInfo info() const override {
    auto i = base_info("add_relu");
    if (op) i.implementation = op->implementation();
    return i;
  }
};

}  // namespace

ValueId Graph::add_relu(ValueId a, ValueId b, const std::string& label) {
  auto& g = *impl_;
  const Shape as = g.values.at(a).shape, bs = g.values.at(b).shape;
  SB_CHECK(a != b, "add_relu: a value added to itself (its gradient would be written twice at once)");
  SB_CHECK(as == bs, fmt::format("add_relu: {} and {} differ", to_string(as), to_string(bs)));
  auto l = std::make_unique<AddReluLayer>();
  l->label = label;
  l->in = {a, b};
  l->out = g.new_value(as, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

}  // namespace stepbench
