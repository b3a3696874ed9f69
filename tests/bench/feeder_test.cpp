// The feeder's staging end to end (bench/feeder.hpp, Towers::stage and stage_on_device): what the
// graph reads after feed() is the plain pipeline's batch, in the graph's layout and dtype, with its
// labels; on the cpu backend bit for bit, and with --decode gpu on a GPU within nvJPEG's difference
// from libjpeg-turbo (the GPU cases skip without one).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/registry.hpp"
#include "bench/feeder.hpp"
#include "data/data.hpp"
#include "support/test_util.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

namespace fs = std::filesystem;

float from_bf16(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
float round_bf16(float f) {  // round to nearest even, as the cast does
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct Case {
  BackendKind backend;
  Precision precision;
  Layout layout;
  DecodeOn decode;
};

void check(const Case& k) {
  if (k.backend == BackendKind::cuda) {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("stepbench_feeder_{}", ::getpid());
  make_dataset(dir.string(), 14, 3, 90, 70, ImageFormat::jpeg, 3);
  struct Remove {
    fs::path p;
    ~Remove() { fs::remove_all(p); }
  } remove{dir};
  TowerOptions o;
  o.backend = k.backend;
  o.batch_per_tower = 4;
  o.model = ModelKind::tiny;
  o.model_options.image_size = 32;
  o.model_options.num_classes = 10;
  o.layout = k.layout;
  o.precision = k.precision;
  std::unique_ptr<Towers> t;
  try {
    t = std::make_unique<Towers>(o);
  } catch (const UnsupportedError& e) {  // bf16 on a CPU without it
    GTEST_SKIP() << e.what();
  }
  BenchConfig c;
  c.run = o;
  c.data = DataKind::image_folder;
  c.data_dir = dir.string();
  c.data_threads = 1;
  c.decode = k.decode;
  Feeder f(c, *t);
  // the reference: the plain pipeline on the CPU, with the graph's batch, size and layout
  PipelineOptions po;
  po.batch = 4;
  po.image_size = 32;
  po.layout = k.layout;
  po.threads = 1;
  ImagePipeline ref(scan_image_folder(dir.string()), po);
  if (k.decode == DecodeOn::gpu) ref.recycle(ref.next());  // the feeder's untimed first batch, one tower
  Backend& be = t->backend(0);
  const Tensor in = t->graph(0).input_tensor();
  ASSERT_EQ(in.desc.layout, k.layout);
  const std::size_t n = static_cast<std::size_t>(in.desc.numel());
  double worst = 0, sum = 0;
  for (int step = 0; step < 5; ++step) {  // over the end of an epoch (14 images, batches of 4)
    f.feed();
    auto want = ref.next();
    const Tensor got = t->graph(0).input_tensor();  // the staging buffer it now reads
    std::vector<float> v(n);
    if (got.desc.dtype == DType::f32) {
      be.copy(t->stream(0), v.data(), got.data, n * sizeof(float));
    } else {
      ASSERT_EQ(got.desc.dtype, DType::bf16);
      std::vector<std::uint16_t> h(n);
      be.copy(t->stream(0), h.data(), got.data, n * sizeof(std::uint16_t));
      be.synchronize(t->stream(0));
      for (std::size_t i = 0; i < n; ++i) v[i] = from_bf16(h[i]);
    }
    std::vector<std::int32_t> labels(4);
    be.copy(t->stream(0), labels.data(), t->graph(0).labels(), sizeof(std::int32_t) * 4);
    be.synchronize(t->stream(0));
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(labels[static_cast<std::size_t>(i)], want->labels[static_cast<std::size_t>(i)]);
    for (std::size_t i = 0; i < n; ++i) {
      const float r = got.desc.dtype == DType::bf16 ? round_bf16(want->images[i]) : want->images[i];
      if (k.decode == DecodeOn::cpu) {
        ASSERT_EQ(v[i], r) << "step " << step << ", element " << i;
      }
      const double d = std::abs(static_cast<double>(v[i]) - r);
      worst = std::max(worst, d);
      sum += d;
    }
    ref.recycle(std::move(want));
  }
  if (k.decode == DecodeOn::gpu) {  // nvJPEG against libjpeg-turbo: GpuDecode.NvJpegAgainstLibjpegTurbo's bounds
    const double level = 1.0 / (255.0 * 0.224);
    const double mean = sum / (5.0 * static_cast<double>(n));
    std::cout << "--decode gpu against the CPU: largest " << worst / level << " levels, mean " << mean / level << "\n";
    EXPECT_LT(worst, 48 * level);
    EXPECT_LT(mean, 2 * level);  // a wrong slot, layout or label order is tens of levels off
  }
  EXPECT_EQ(f.skipped(), "");
}

TEST(Feeder, StagedBatchesAreThePipelinesOnTheCpu) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) check({BackendKind::cpu, Precision::fp32, l, DecodeOn::cpu});
}
TEST(Feeder, StagedBatchesAreThePipelinesOnAGpu) {
  check({BackendKind::cuda, Precision::bf16, Layout::nhwc, DecodeOn::cpu});
}
TEST(Feeder, DecodedOnTheGpuTheyAreThePipelinesWithinNvJpegsDifference) {
  for (auto [p, l] : {std::pair{Precision::fp32, Layout::nchw}, std::pair{Precision::bf16, Layout::nhwc}})
    check({BackendKind::cuda, p, l, DecodeOn::gpu});
}

}  // namespace
}  // namespace stepbench
