// torchvision.models.inception_v3, layer by layer (shared/reference/inception_v3.md).
#include <fmt/format.h>

#include "models/models.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

ConvParams k(int kh, int kw, int ph = 0, int pw = 0, int s = 1) { return {kh, kw, s, s, ph, pw}; }
const PoolParams kMax3s2{PoolKind::max, 3, 3, 2, 2, 0, 0};
const PoolParams kAvg3s1p1{PoolKind::avg_include_pad, 3, 3, 1, 1, 1, 1};

struct Builder {
  Graph& g;
  std::string block;
  ValueId c(const std::string& name, ValueId x, std::int64_t out, ConvParams p, float std = 0.1f) {
    return g.conv_bn_relu(block + "." + name, x, out, p, std);
  }
};

ValueId inception_a(Graph& g, const std::string& name, ValueId x, std::int64_t pool_features) {
  Builder b{g, name};
  auto b1 = b.c("branch1x1", x, 64, k(1, 1));
  auto b5 = b.c("branch5x5_1", x, 48, k(1, 1));
  b5 = b.c("branch5x5_2", b5, 64, k(5, 5, 2, 2));
  auto b3 = b.c("branch3x3dbl_1", x, 64, k(1, 1));
  b3 = b.c("branch3x3dbl_2", b3, 96, k(3, 3, 1, 1));
  b3 = b.c("branch3x3dbl_3", b3, 96, k(3, 3, 1, 1));
  auto bp = b.c("branch_pool", g.pool(x, kAvg3s1p1, name + ".avg_pool"), pool_features, k(1, 1));
  return g.concat({b1, b5, b3, bp});
}

ValueId inception_b(Graph& g, const std::string& name, ValueId x) {
  Builder b{g, name};
  auto b3 = b.c("branch3x3", x, 384, k(3, 3, 0, 0, 2));
  auto bd = b.c("branch3x3dbl_1", x, 64, k(1, 1));
  bd = b.c("branch3x3dbl_2", bd, 96, k(3, 3, 1, 1));
  bd = b.c("branch3x3dbl_3", bd, 96, k(3, 3, 0, 0, 2));
  auto bp = g.pool(x, kMax3s2, name + ".max_pool");
  return g.concat({b3, bd, bp});
}

ValueId inception_c(Graph& g, const std::string& name, ValueId x, std::int64_t c7) {
  Builder b{g, name};
  auto b1 = b.c("branch1x1", x, 192, k(1, 1));
  auto b7 = b.c("branch7x7_1", x, c7, k(1, 1));
  b7 = b.c("branch7x7_2", b7, c7, k(1, 7, 0, 3));
  b7 = b.c("branch7x7_3", b7, 192, k(7, 1, 3, 0));
  auto bd = b.c("branch7x7dbl_1", x, c7, k(1, 1));
  bd = b.c("branch7x7dbl_2", bd, c7, k(7, 1, 3, 0));
  bd = b.c("branch7x7dbl_3", bd, c7, k(1, 7, 0, 3));
  bd = b.c("branch7x7dbl_4", bd, c7, k(7, 1, 3, 0));
  bd = b.c("branch7x7dbl_5", bd, 192, k(1, 7, 0, 3));
  auto bp = b.c("branch_pool", g.pool(x, kAvg3s1p1, name + ".avg_pool"), 192, k(1, 1));
  return g.concat({b1, b7, bd, bp});
}

ValueId inception_d(Graph& g, const std::string& name, ValueId x) {
  Builder b{g, name};
  auto b3 = b.c("branch3x3_1", x, 192, k(1, 1));
  b3 = b.c("branch3x3_2", b3, 320, k(3, 3, 0, 0, 2));
  auto b7 = b.c("branch7x7x3_1", x, 192, k(1, 1));
  b7 = b.c("branch7x7x3_2", b7, 192, k(1, 7, 0, 3));
  b7 = b.c("branch7x7x3_3", b7, 192, k(7, 1, 3, 0));
  b7 = b.c("branch7x7x3_4", b7, 192, k(3, 3, 0, 0, 2));
  auto bp = g.pool(x, kMax3s2, name + ".max_pool");
  return g.concat({b3, b7, bp});
}

ValueId inception_e(Graph& g, const std::string& name, ValueId x) {
  Builder b{g, name};
  auto b1 = b.c("branch1x1", x, 320, k(1, 1));
  auto b3 = b.c("branch3x3_1", x, 384, k(1, 1));
  auto b3a = b.c("branch3x3_2a", b3, 384, k(1, 3, 0, 1));
  auto b3b = b.c("branch3x3_2b", b3, 384, k(3, 1, 1, 0));
  auto bd = b.c("branch3x3dbl_1", x, 448, k(1, 1));
  bd = b.c("branch3x3dbl_2", bd, 384, k(3, 3, 1, 1));
  auto bda = b.c("branch3x3dbl_3a", bd, 384, k(1, 3, 0, 1));
  auto bdb = b.c("branch3x3dbl_3b", bd, 384, k(3, 1, 1, 0));
  auto bp = b.c("branch_pool", g.pool(x, kAvg3s1p1, name + ".avg_pool"), 192, k(1, 1));
  // torchvision concatenates [branch1x1, cat(3x3_2a, 3x3_2b), cat(3x3dbl_3a, 3x3dbl_3b), branch_pool]
  return g.concat({b1, b3a, b3b, bda, bdb, bp});
}

}  // namespace

ModelInfo build_inception_v3(Graph& g, const ModelOptions& o) {
  require_image_size(ModelKind::inception_v3, o.image_size);
  auto x = g.input(3, o.image_size, o.image_size);
  x = g.conv_bn_relu("Conv2d_1a_3x3", x, 32, k(3, 3, 0, 0, 2));
  x = g.conv_bn_relu("Conv2d_2a_3x3", x, 32, k(3, 3));
  x = g.conv_bn_relu("Conv2d_2b_3x3", x, 64, k(3, 3, 1, 1));
  x = g.pool(x, kMax3s2, "maxpool1");
  x = g.conv_bn_relu("Conv2d_3b_1x1", x, 80, k(1, 1));
  x = g.conv_bn_relu("Conv2d_4a_3x3", x, 192, k(3, 3));
  x = g.pool(x, kMax3s2, "maxpool2");
  x = inception_a(g, "Mixed_5b", x, 32);
  x = inception_a(g, "Mixed_5c", x, 64);
  x = inception_a(g, "Mixed_5d", x, 64);
  x = inception_b(g, "Mixed_6a", x);
  x = inception_c(g, "Mixed_6b", x, 128);
  x = inception_c(g, "Mixed_6c", x, 160);
  x = inception_c(g, "Mixed_6d", x, 160);
  x = inception_c(g, "Mixed_6e", x, 192);
  ModelInfo info{std::string(model_entry(ModelKind::inception_v3).name), o.image_size};
  if (o.aux_logits) {
    // The aux head pools 5x5 / stride 3, then runs a 5x5 conv without padding: Mixed_6e must be
    // at least 17x17, which takes a 299x299 image (torchvision fails the same way below it).
    const std::int64_t side = g.shape_of(x).h;
    if (side < 17)
      throw UsageError(
          fmt::format("--image-size {} is too small for the auxiliary head (Mixed_6e is {}x{}, it "
                      "needs 17x17: at least 299); use --image-size 299 or larger, or --aux-logits off",
                      o.image_size, side, side));
    g.set_training_only(true);
    auto a = g.pool(x, {PoolKind::avg_include_pad, 5, 5, 3, 3, 0, 0}, "AuxLogits.avg_pool");
    a = g.conv_bn_relu("AuxLogits.conv0", a, 128, k(1, 1));
    // torchvision sets stddev = 0.01 on the BasicConv2d wrapper, which its init loop never reads:
    // the conv inside gets the default 0.1 (measured with torchvision 0.14).
    a = g.conv_bn_relu("AuxLogits.conv1", a, 768, k(5, 5));
    a = g.global_avg_pool(a, "AuxLogits.adaptive_avg_pool");  // adaptive average pool to 1x1
    info.aux_logits = g.linear("AuxLogits.fc", a, o.num_classes, 0.001f);
    g.cross_entropy(info.aux_logits, 0.4f, "aux_logits");
    g.set_training_only(false);
  }
  x = inception_d(g, "Mixed_7a", x);
  x = inception_e(g, "Mixed_7b", x);
  x = inception_e(g, "Mixed_7c", x);
  x = g.global_avg_pool(x, "avgpool");
  if (o.dropout > 0) x = g.dropout(x, o.dropout, "dropout");
  info.logits = g.linear("fc", x, o.num_classes);
  g.cross_entropy(info.logits, 1.0f, "logits");
  return info;
}

}  // namespace stepbench
