// The adaptive average pool layer (AdaptiveAvgPool2d to a fixed size: VGG's 7 x 7 and AlexNet's
// 6 x 6 before their classifiers) and its builder call Graph::adaptive_avg_pool.
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

struct AdaptivePoolLayer final : Layer {
  std::unique_ptr<AdaptiveAvgPoolOp> op;
  void declare(Uses& u, bool training) override {
    u.forward("fwd").reads(in[0]).writes(out);
    if (!training) return;
    u.backward("bwd");
    if (u.needs_grad(in[0])) u.reads_grad(out).writes_grad(in[0], in_beta[0]);
  }
  void plan(Graph::Impl& g) override { op = g.be.make_adaptive_avg_pool(g.values[in[0]].t.desc, g.values[out].t.desc); }
  void forward(Graph::Impl& g, Stream& s, bool) override { op->forward(s, g.values[in[0]].t, g.values[out].t); }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value& x = g.values[in[0]];
    if (x.needs_grad) op->backward(s, g.values[out].g, x.g, in_beta[0]);
  }
  LayerInfo info() const override { return base_info("adaptive_avg_pool"); }
};

}  // namespace

ValueId Graph::adaptive_avg_pool(ValueId x, std::int64_t h, std::int64_t w, const std::string& label) {
  auto& g = *impl_;
  SB_CHECK(h > 0 && w > 0, fmt::format("adaptive_avg_pool: an output of {}x{}", h, w));
  const Shape xs = g.values.at(x).shape;
  auto l = std::make_unique<AdaptivePoolLayer>();
  l->label = label;
  l->in = {x};
  l->out = g.new_value({xs.n, xs.c, h, w}, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

}  // namespace stepbench
