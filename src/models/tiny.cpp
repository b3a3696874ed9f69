#include "models/models.hpp"

namespace stepbench {

ModelInfo build_tiny(Graph& g, const ModelOptions& o) {
  require_image_size(ModelKind::tiny, o.image_size);
  auto x = g.input(3, o.image_size, o.image_size);
  x = g.conv_bn_relu("conv1", x, 16, {3, 3, 2, 2, 0, 0});
  x = g.conv_bn_relu("conv2", x, 24, {3, 3, 1, 1, 1, 1});
  x = g.pool(x, {PoolKind::max, 3, 3, 2, 2, 0, 0}, "maxpool");
  // one Inception-style block: four branches from one input, concatenated
  auto b1 = g.conv_bn_relu("block.branch1x1", x, 16, {1, 1});
  auto b2 = g.conv_bn_relu("block.branch5x5_1", x, 12, {1, 1});
  b2 = g.conv_bn_relu("block.branch5x5_2", b2, 16, {5, 5, 1, 1, 2, 2});
  auto b3 = g.conv_bn_relu("block.branch3x3_1", x, 16, {1, 7, 1, 1, 0, 3});
  b3 = g.conv_bn_relu("block.branch3x3_2", b3, 16, {7, 1, 1, 1, 3, 0});
  auto b4 = g.pool(x, {PoolKind::avg_include_pad, 3, 3, 1, 1, 1, 1}, "block.avg_pool");
  b4 = g.conv_bn_relu("block.branch_pool", b4, 8, {1, 1});
  x = g.concat({b1, b2, b3, b4});
  x = g.global_avg_pool(x, "avgpool");
  if (o.dropout > 0) x = g.dropout(x, o.dropout, "dropout");
  ModelInfo info{std::string(model_entry(ModelKind::tiny).name), o.image_size};
  info.logits = g.linear("fc", x, o.num_classes);
  g.cross_entropy(info.logits, 1.0f, "logits");
  return info;
}

}  // namespace stepbench
