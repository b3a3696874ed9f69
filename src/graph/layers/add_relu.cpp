// The add_relu layer (a residual connection: relu(a + b), fused) and its builder call Graph::add_relu;
// with GraphConfig::fuse, an input that is a unit's unstored output is its z loaded through the unit's
// batch norm (BN + add + ReLU).
// Backward sends one masked gradient to both inputs; planning's fan-out decides, per input, whether
// it overwrites the input's gradient or adds to it (the block input also feeds the first convolution).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "backend/fused.hpp"
#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/conv_bn_relu.hpp"
#include "graph/layers/layer.hpp"
#include "graph/liveness.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

struct AddReluLayer final : Layer {
  std::unique_ptr<AddReluOp> op;
  // fused (GraphConfig::fuse): an input that is a unit's output not stored is loaded through the
  // unit's batch norm (BN + add + ReLU in one op)
  std::unique_ptr<BnAddReluOp> fop;
  Slot ws;
  bool fused() const { return unit_at(0) || unit_at(1); }
  bool loads_normalised(std::size_t, bool relu) const override { return !relu; }
  void declare(Uses& u, bool training) override {
    u.forward("fwd");
    for (std::size_t k : {0, 1}) {
      if (ConvBnReluLayer* from = unit_at(k)) {
        u.reads(from->z, "z");
        if (training)
          u.reads(from->saved, "batch statistics")
              .reads(from->bn_reserve, "bn reserve")
              .reads(from->norm, "bn factors");
      } else {
        u.reads(in[k]);
      }
    }
    u.writes(out);
    if (fused()) u.scratch(ws, "workspace");
    if (!training) return;
    u.backward("bwd");
    if (!u.needs_grad(in[0]) && !u.needs_grad(in[1])) return;
    u.reads(out).reads_grad(out);  // the mask: where the output is positive
    for (int k : {0, 1})
      if (u.needs_grad(in[k])) u.writes_grad(in[k], in_beta[k]);
  }
  void plan(Graph::Impl& g) override {
    if (!fused()) {
      op = g.be.make_add_relu(g.values[out].t.desc);
      return;
    }
    auto unit_op = [&](std::size_t k) { return unit_at(k) ? unit_at(k)->bnu.get() : nullptr; };
    fop = g.be.make_bn_add_relu(g.values[out].t.desc, unit_op(0), unit_op(1));
    ws.size = fop->workspace_bytes();
  }
  void forward(Graph::Impl& g, Stream& s, bool training) override {
    if (!fused()) return op->forward(s, g.values[in[0]].t, g.values[in[1]].t, g.values[out].t);
    UnitNorm n[2];
    Tensor t[2];
    for (std::size_t k : {0, 1}) {
      const ConvBnReluLayer* from = unit_at(k);
      t[k] = from ? Tensor{from->z.get(), from->zdesc} : g.values[in[k]].t;
      if (from) n[k] = from->unit_norm(g, training);
    }
    fop->forward(s, t[0], unit_at(0) ? &n[0] : nullptr, t[1], unit_at(1) ? &n[1] : nullptr, g.values[out].t, ws.get());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &a = g.values[in[0]], &b = g.values[in[1]], &y = g.values[out];
    const Tensor da = a.needs_grad ? a.g : Tensor{}, db = b.needs_grad ? b.g : Tensor{};
    if (fop)
      fop->backward(s, y.t, y.g, da, in_beta[0], db, in_beta[1]);
    else
      op->backward(s, y.t, y.g, da, in_beta[0], db, in_beta[1]);
  }
  LayerInfo info() const override {
    auto i = base_info("add_relu");
    if (op) i.implementation = op->implementation();
    if (fop) i.implementation = i.fused = fop->implementation();
    for (std::size_t k : {0, 1}) i.loads.push_back(unit_at(k) ? unit_at(k)->name : "");
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
