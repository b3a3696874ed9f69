// Model builders. Each adds layers to a Graph (not yet planned) and returns its description.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.hpp"

namespace stepbench {

enum class ModelKind {
  inception_v3,
  resnet50,
  resnet101,
  resnet152,
  vgg16,
  alexnet,
  densenet121,
  mobilenet_v2,
  tiny,
  pool_fc
};

// The one list of models: the name table, --model's choices and help, the image sizes, `stepbench
// --list-models` (which docs/flags.md's table and the tests are checked against) follow from it.
struct ModelEntry {
  ModelKind kind;
  std::string_view name;
  std::int64_t image_size;      // its torchvision training size, unless told
  std::int64_t min_image_size;  // the smallest its downsampling allows
  bool offered;                 // on the command line (pool_fc is for the towers' tests)
  std::string_view tf_cnn;      // tf_cnn_benchmarks' --model for the same network ("" : none)
  std::string_view what;
};
inline constexpr std::array<ModelEntry, 10> kModels{{
    {ModelKind::inception_v3, "inception_v3", 299, 75, true, "inception3", "torchvision's Inception-v3"},
    {ModelKind::resnet50, "resnet50", 224, 32, true, "resnet50_v1.5", "torchvision's ResNet-50 (v1.5)"},
    {ModelKind::resnet101, "resnet101", 224, 32, true, "resnet101 (v1: stride on the 1x1)",
     "torchvision's ResNet-101 (v1.5)"},
    {ModelKind::resnet152, "resnet152", 224, 32, true, "resnet152 (v1: stride on the 1x1)",
     "torchvision's ResNet-152 (v1.5)"},
    {ModelKind::vgg16, "vgg16", 224, 32, true, "vgg16", "torchvision's VGG-16 (no batch norm)"},
    {ModelKind::alexnet, "alexnet", 224, 63, true, "alexnet", "torchvision's AlexNet"},
    {ModelKind::densenet121, "densenet121", 224, 32, true, "", "torchvision's DenseNet-121"},
    {ModelKind::mobilenet_v2, "mobilenet_v2", 224, 32, true, "mobilenet (TensorFlow 1 only)",
     "torchvision's MobileNet-v2"},
    {ModelKind::tiny, "tiny", 64, 16, true, "", "a small CNN for quick checks"},
    {ModelKind::pool_fc, "pool_fc", 64, 8, false, "", "pools and two fc layers (the towers' tests)"},
}};
constexpr const ModelEntry& model_entry(ModelKind k) {
  for (const auto& m : kModels)
    if (m.kind == k) return m;
  return kModels[0];
}
constexpr bool every_kind_has_a_row() {
  for (int k = 0; k <= static_cast<int>(ModelKind::pool_fc); ++k) {
    bool found = false;
    for (const auto& m : kModels) found = found || m.kind == static_cast<ModelKind>(k);
    if (!found) return false;
  }
  return true;
}
static_assert(every_kind_has_a_row(), "each ModelKind needs its row in kModels");
constexpr auto enum_names(ModelKind) {
  std::array<EnumName<ModelKind>, kModels.size()> names{};
  for (std::size_t i = 0; i < kModels.size(); ++i) names[i] = {kModels[i].kind, kModels[i].name};
  return names;
}
// The models the command line offers.
inline std::vector<std::string> user_models() {
  std::vector<std::string> out;
  for (const auto& m : kModels)
    if (m.offered) out.emplace_back(m.name);
  return out;
}
// The image size a model runs at unless told: its torchvision training size (tiny: 64).
constexpr std::int64_t default_image_size(ModelKind k) { return model_entry(k).image_size; }
// UsageError when image_size is below what the model's downsampling allows.
void require_image_size(ModelKind k, std::int64_t image_size);
// The offered models as `stepbench --list-models` prints them: one line each, in columns.
std::string models_table();

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
// Exactly torchvision.models.resnet50, resnet101 or resnet152 (v1.5): state_dict names, shapes,
// initialisation; reports name its units by torchvision's modules (layer1.0.conv1,
// layer1.0.downsample) and each residual addition with its ReLU <block>.add_relu. image_size >= 32.
ModelInfo build_resnet(Graph& g, ModelKind depth, const ModelOptions& o);
inline ModelInfo build_resnet50(Graph& g, const ModelOptions& o) { return build_resnet(g, ModelKind::resnet50, o); }
// Exactly torchvision.models.vgg16 and alexnet (no batch norm; dropout in the classifier unless
// o.dropout is 0): state_dict names, shapes, initialisation.
ModelInfo build_vgg16(Graph& g, const ModelOptions& o);
ModelInfo build_alexnet(Graph& g, const ModelOptions& o);
// Exactly torchvision.models.densenet121: state_dict names, shapes, initialisation.
ModelInfo build_densenet121(Graph& g, const ModelOptions& o);
// Exactly torchvision.models.mobilenet_v2: state_dict names, shapes, initialisation; dropout 0.2
// (torchvision's) before the classifier unless o.dropout is 0.
ModelInfo build_mobilenet_v2(Graph& g, const ModelOptions& o);
// A tiny CNN for fast tests: conv-BN-ReLU units, one Inception-style block with fan-out and concat,
// a pool and an FC. image_size >= 16.
ModelInfo build_tiny(Graph& g, const ModelOptions& o);
// No batch norm: pools and two fully connected layers (for the towers' test that N towers of batch B
// equal one tower of batch N x B, which BN's per-tower statistics rule out for the others).
ModelInfo build_pool_fc(Graph& g, const ModelOptions& o);
ModelInfo build_model(Graph& g, ModelKind kind, const ModelOptions& o);

}  // namespace stepbench
