// The cross_entropy layer (softmax cross-entropy of logits against the graph's labels, one weighted
// term of the loss) and its builder call Graph::cross_entropy, which also names the logits as an
// output.
#include <memory>
#include <string>

#include "graph/graph.hpp"
#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"
#include "graph/liveness.hpp"

namespace stepbench {
namespace {

struct LossLayer final : Layer {
  float weight;
  int slot;
  std::unique_ptr<SoftmaxCrossEntropyOp> op;
  Slot reserve;  // the probabilities
  void declare(Uses& u, bool training) override {
    u.forward("fwd").reads(in[0]).writes(reserve, "probabilities");
    if (training) u.backward("bwd").reads(reserve, "probabilities").writes_grad(in[0], in_beta[0]);
  }
  void plan(Graph::Impl& g) override {
    op = g.be.make_softmax_cross_entropy(g.values[in[0]].t.desc);
    reserve.size = op->reserve_bytes();
  }
  void forward(Graph::Impl& g, Stream& s, bool) override {
    op->forward(s, g.values[in[0]].t, g.label_ptr(), g.losses.as<float>() + slot, reserve.get());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    op->backward(s, g.label_ptr(), g.values[in[0]].g, weight, in_beta[0], reserve.get(), g.loss_scale_ptr());
  }
  void check_after_sync() override { op->check_labels(); }
  std::string name;
  LayerInfo info() const override {
    LayerInfo i = base_info("cross_entropy", name);
    i.loss_weight = weight;
    return i;
  }
};

}  // namespace

void Graph::cross_entropy(ValueId logits, float weight, const std::string& output_name) {
  auto& g = *impl_;
  auto l = std::make_unique<LossLayer>();
  l->weight = weight;
  l->name = output_name;
  l->label = "loss(" + output_name + ")";
  l->slot = g.num_losses++;
  l->in = {logits};
  g.loss_weights.push_back(weight);
  g.outputs[output_name] = logits;
  g.add_layer(std::move(l));
}

}  // namespace stepbench
