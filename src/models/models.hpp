// Model builders. Each adds layers to a Graph (not yet planned) and returns its description.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace stepbench {

enum class ModelKind { inception_v3, resnet50, tiny, pool_fc };
constexpr auto enum_names(ModelKind) {
  return std::array<EnumName<ModelKind>, 4>{{{ModelKind::inception_v3, "inception_v3"},
                                             {ModelKind::resnet50, "resnet50"},
                                             {ModelKind::tiny, "tiny"},
                                             {ModelKind::pool_fc, "pool_fc"}}};
}
// The models the command line offers (pool_fc is for the towers' tests).
inline std::vector<std::string> user_models() { return {"inception_v3", "resnet50", "tiny"}; }
// The image size a model runs at unless told: its torchvision training size (tiny: 64).
constexpr std::int64_t default_image_size(ModelKind k) {
  return k == ModelKind::inception_v3 ? 299 : k == ModelKind::resnet50 ? 224 : 64;
}

struct ModelOptions {
  std::int64_t num_classes = 1000;
  std::int64_t image_size = 299;
  bool aux_logits = true;  // Inception's auxiliary head (training only)
  double dropout = 0.5;    // before the final fc, training only; 0 leaves it out
};

struct ModelInfo {
  std::string name;
  std::int64_t image_size = 0;
  ValueId logits = -1, aux_logits = -1;
};

// Exactly torchvision.models.inception_v3 (transform_input=False): state_dict names, shapes,
// initialisation. Adds the cross-entropy loss (aux weighted 0.4, torchvision's training reference).
ModelInfo build_inception_v3(Graph& g, const ModelOptions& o);
// Exactly torchvision.models.resnet50 (v1.5): state_dict names, shapes, initialisation; reports name
// its units by torchvision's modules (layer1.0.conv1, layer1.0.downsample) and each residual
// addition with its ReLU <block>.add_relu. image_size >= 32.
ModelInfo build_resnet50(Graph& g, const ModelOptions& o);
// A tiny CNN for fast tests: conv-BN-ReLU units, one Inception-style block with fan-out and concat,
// a pool and an FC. image_size >= 16.
ModelInfo build_tiny(Graph& g, const ModelOptions& o);
// No batch norm: pools and two fully connected layers (for the towers' test that N towers of batch B
// equal one tower of batch N x B, which BN's per-tower statistics rule out for the others).
ModelInfo build_pool_fc(Graph& g, const ModelOptions& o);
ModelInfo build_model(Graph& g, ModelKind kind, const ModelOptions& o);

}  // namespace stepbench
