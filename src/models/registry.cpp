#include <fmt/format.h>

#include "models/models.hpp"
#include "tensor/error.hpp"

namespace stepbench {

void require_image_size(ModelKind k, std::int64_t image_size) {
  const ModelEntry& m = model_entry(k);
  if (image_size < m.min_image_size)
    throw UsageError(
        fmt::format("--image-size {} is too small for {} (at least {}: below, its downsampling leaves no feature map)",
                    image_size, m.name, m.min_image_size));
}

std::string models_table() {
  std::string s =
      fmt::format("{:<14}{:>6}{:>10}  {:<36}{}\n", "model", "image", "smallest", "tf_cnn_benchmarks", "network");
  for (const auto& m : kModels)
    if (m.offered)
      s += fmt::format("{:<14}{:>6}{:>10}  {:<36}{}\n", m.name, m.image_size, m.min_image_size,
                       m.tf_cnn.empty() ? "-" : m.tf_cnn, m.what);
  return s;
}

ModelInfo build_model(Graph& g, ModelKind kind, const ModelOptions& o) {
  switch (kind) {
    case ModelKind::inception_v3: return build_inception_v3(g, o);
    case ModelKind::resnet50:
    case ModelKind::resnet101:
    case ModelKind::resnet152: return build_resnet(g, kind, o);
    case ModelKind::vgg16: return build_vgg16(g, o);
    case ModelKind::alexnet: return build_alexnet(g, o);
    case ModelKind::densenet121: return build_densenet121(g, o);
    case ModelKind::mobilenet_v2: return build_mobilenet_v2(g, o);
    case ModelKind::tiny: return build_tiny(g, o);
    case ModelKind::pool_fc: return build_pool_fc(g, o);
  }
  return build_inception_v3(g, o);
}

}  // namespace stepbench
