#include "models/models.hpp"

namespace stepbench {

ModelInfo build_pool_fc(Graph& g, const ModelOptions& o) {
  require_image_size(ModelKind::pool_fc, o.image_size);
  auto x = g.input(3, o.image_size, o.image_size);
  x = g.pool(x, {PoolKind::max, 3, 3, 2, 2, 0, 0});
  x = g.pool(x, {PoolKind::avg_exclude_pad, 3, 3, 1, 1, 1, 1});
  x = g.global_avg_pool(x);
  x = g.linear("fc1", x, 16);
  ModelInfo info{std::string(model_entry(ModelKind::pool_fc).name), o.image_size};
  info.logits = g.linear("fc2", x, o.num_classes);
  g.cross_entropy(info.logits, 1.0f, "logits");
  return info;
}

}  // namespace stepbench
