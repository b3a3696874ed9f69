#include "models/models.hpp"

namespace stepbench {

ModelInfo build_model(Graph& g, ModelKind kind, const ModelOptions& o) {
  switch (kind) {
    case ModelKind::inception_v3: return build_inception_v3(g, o);
    case ModelKind::resnet50: return build_resnet50(g, o);
    case ModelKind::tiny: return build_tiny(g, o);
    case ModelKind::pool_fc: return build_pool_fc(g, o);
  }
  return build_inception_v3(g, o);
}

}  // namespace stepbench
