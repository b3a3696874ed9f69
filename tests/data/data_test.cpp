// Input pipelines: the JPEG folder scan, decode + random-resized-crop + normalisation, the
// threaded pipeline with corrupt files, and the errors for missing or empty folders.
#include <fmt/format.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "data/data.hpp"
#include "data/stages.hpp"
#include "support/temp_dir.hpp"
#include "support/test_util.hpp"

namespace stepbench {
namespace {
namespace fs = std::filesystem;

void write_solid_jpeg(const fs::path& path, int w, int h, unsigned char r, unsigned char g, unsigned char b) {
  std::vector<unsigned char> rgb(static_cast<std::size_t>(w) * h * 3);
  for (std::size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = r;
    rgb[i + 1] = g;
    rgb[i + 2] = b;
  }
  tjhandle tj = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &jpeg, &size, TJSAMP_444, 100, 0), 0);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(jpeg), static_cast<std::streamsize>(size));
  tjFree(jpeg);
  tjDestroy(tj);
}

// One worker's clock, with known sleeps in each place: every sleep lands in its own stage, the wait
// and the stage still open (a clock that charged a lap to the wrong stage, lost the wait or the open
// stage, or counted a moment twice fails). Sleeps never end early, so the lower bounds hold on a
// loaded machine; the upper bound is the window measured outside both snapshots.
TEST(Data, StageCountersChargeEachMomentToWhereTheThreadWas) {
  using namespace std::chrono_literals;
  StageCounters c;
  const auto t0 = std::chrono::steady_clock::now();
  StageTimes before;
  c.add_to(before);
  std::this_thread::sleep_for(30ms);
  c.lap(Stage::decode);
  std::this_thread::sleep_for(10ms);
  c.lap(Stage::resize);
  c.count_image();
  std::this_thread::sleep_for(5ms);
  c.begin_idle();  // the time since the last lap is the batch's bookkeeping
  std::this_thread::sleep_for(20ms);
  c.end_idle();
  std::this_thread::sleep_for(15ms);  // in a stage not yet ended at the snapshot
  StageTimes after;
  c.add_to(after);
  const double window = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const StageTimes d = after - before;
  EXPECT_GE(d[Stage::decode], 0.030);
  EXPECT_GE(d[Stage::resize], 0.010);
  EXPECT_GE(d[Stage::assembly], 0.005);
  EXPECT_GE(d.idle, 0.020);
  EXPECT_GE(d.open, 0.015);
  for (Stage s : {Stage::read, Stage::crop, Stage::flip_normalise, Stage::copy}) EXPECT_EQ(d[s], 0.0);
  EXPECT_EQ(d.images, 1u);
  EXPECT_LE(d.busy() + d.idle + d.open, window);
  // the first snapshot's open stage is counted in the later one's lap, not lost
  EXPECT_GE(d.busy() + d.idle + d.open, 0.080);
}

TEST(Data, MakeDatasetWritesAnImageNetStyleFolder) {
  test::TempDir d("data");
  EXPECT_EQ(make_dataset(d.str(), 10, 3, 50, 40), 10u);
  const auto f = scan_image_folder(d.str());
  EXPECT_EQ(f.files.size(), 10u);
  ASSERT_EQ(f.classes.size(), 3u);
  EXPECT_EQ(f.classes[0], "class_0000");
  std::vector<int> per_class(3, 0);
  for (auto l : f.labels) ++per_class.at(static_cast<std::size_t>(l));
  EXPECT_EQ(per_class, (std::vector<int>{4, 3, 3}));
}

TEST(Data, MissingOrEmptyFoldersAreUsageErrors) {
  test::TempDir d("data");
  EXPECT_THROW(scan_image_folder(d.str() + "/nope"), UsageError);
  EXPECT_THROW(scan_image_folder(d.str()), UsageError);  // empty
  fs::create_directories(d.p / "cls");
  std::ofstream(d.p / "cls" / "readme.txt") << "not an image";
  try {
    scan_image_folder(d.str());
    FAIL() << "a folder without JPEG files must be an error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no JPEG or PNG files"), std::string::npos) << e.what();
  }
}

TEST(Data, DecodeCropNormaliseGivesImageNetNormalisedValuesInEitherLayout) {
  test::TempDir d("data");
  const auto path = (d.p / "solid.jpg").string();
  write_solid_jpeg(path, 64, 48, 200, 100, 50);
  PipelineOptions o;
  o.image_size = 20;
  std::vector<float> nchw(3 * 20 * 20), nhwc(3 * 20 * 20);
  std::string why;
  ASSERT_TRUE(decode_crop_normalise(path, nchw.data(), o, 123, why)) << why;
  o.layout = Layout::nhwc;
  ASSERT_TRUE(decode_crop_normalise(path, nhwc.data(), o, 123, why)) << why;
  const float rgb[3] = {200, 100, 50};
  // At quality 100 (quantisation step 1) and 4:4:4 a flat colour loses only in the colour
  // conversions: Y, Cb, Cr rounded to integer levels (+-0.5 each), carried into R, G, B by the
  // inverse transform's coefficients (at most 1 + 1.772 / 2 levels), then rounded: under 2 levels.
  const float levels = 2;
  for (int c = 0; c < 3; ++c) {
    const float want = (rgb[c] / 255.0f - o.mean[c]) / o.stddev[c];
    for (int i = 0; i < 400; ++i) {
      EXPECT_NEAR(nchw[static_cast<std::size_t>(c * 400 + i)], want, levels / 255.0f / o.stddev[c]);
      EXPECT_EQ(nhwc[static_cast<std::size_t>(i * 3 + c)], nchw[static_cast<std::size_t>(c * 400 + i)]);
    }
  }
}

// The crop and the flip on an image whose channels are affine in x and y (R = 2x + 1, G = 3y + 5,
// B = x + y): bilinear sampling at pixel centres reproduces an affine function exactly, so every
// output pixel is that function at its source point, b.x + clamp((ox + 0.5) w / S - 0.5, 0, w - 1)
// (and the same in y), whatever the interpolation's taps. A box read from the wrong row or column,
// or a flip that is not a mirror in x, fails in one of the boxes (shrunk, enlarged, wide, tall).
TEST(Data, CropAndFlipPutEachPixelWhereItsSourcePointIs) {
  const int R = 64, S = 16;
  std::vector<unsigned char> img(static_cast<std::size_t>(R) * R * 3);
  for (int y = 0; y < R; ++y)
    for (int x = 0; x < R; ++x) {
      unsigned char* p = &img[(static_cast<std::size_t>(y) * R + x) * 3];
      p[0] = static_cast<unsigned char>(2 * x + 1);
      p[1] = static_cast<unsigned char>(3 * y + 5);
      p[2] = static_cast<unsigned char>(x + y);
    }
  PipelineOptions o;
  for (const CropBox& b : {CropBox{10, 12, 30, 24, false}, CropBox{5, 40, 10, 12, true}, CropBox{0, 3, 64, 20, true},
                           CropBox{33, 0, 20, 61, false}}) {
    SCOPED_TRACE(fmt::format("box {},{} {}x{}{}", b.x, b.y, b.w, b.h, b.flip ? " flipped" : ""));
    std::vector<float> crop(static_cast<std::size_t>(S) * S * 3), nchw(crop.size()), nhwc(crop.size());
    crop_resize(img.data(), R, b, S, crop.data());
    flip_normalise(crop.data(), S, b.flip, Layout::nchw, o, nchw.data());
    flip_normalise(crop.data(), S, b.flip, Layout::nhwc, o, nhwc.data());
    const auto source = [S](int o, int at, int len) {
      return at + std::clamp((o + 0.5) * len / S - 0.5, 0.0, len - 1.0);
    };
    for (int oy = 0; oy < S; ++oy)
      for (int ox = 0; ox < S; ++ox) {
        const double sx = source(ox, b.x, b.w), sy = source(oy, b.y, b.h);
        const double want[3] = {2 * sx + 1, 3 * sy + 5, sx + sy};
        const int dx = b.flip ? S - 1 - ox : ox;  // where the flip puts it
        for (int c = 0; c < 3; ++c) {
          const float got = crop[(static_cast<std::size_t>(oy) * S + ox) * 3 + c];
          ASSERT_NEAR(got, want[c], 1e-3) << "crop at " << ox << "," << oy << " channel " << c;
          const double norm = (want[c] / 255.0 - o.mean[c]) / o.stddev[c];
          ASSERT_NEAR(nchw[(static_cast<std::size_t>(c) * S + oy) * S + dx], norm, 1e-4) << "nchw " << ox << "," << oy;
          ASSERT_NEAR(nhwc[(static_cast<std::size_t>(oy) * S + dx) * 3 + c], norm, 1e-4) << "nhwc " << ox << "," << oy;
        }
      }
  }
}

TEST(Data, CropsAreRandomButSeeded) {
  test::TempDir d("data");
  make_dataset(d.str(), 1, 1, 120, 90);
  const auto f = scan_image_folder(d.str());
  PipelineOptions o;
  o.image_size = 16;
  std::vector<float> a(768), b(768), c(768);
  std::string why;
  ASSERT_TRUE(decode_crop_normalise(f.files[0], a.data(), o, 1, why));
  ASSERT_TRUE(decode_crop_normalise(f.files[0], b.data(), o, 1, why));
  ASSERT_TRUE(decode_crop_normalise(f.files[0], c.data(), o, 2, why));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Data, CorruptFilesAreSkippedCountedAndReported) {
  test::TempDir d("data");
  make_dataset(d.str(), 12, 2, 64, 48);
  std::ofstream(d.p / "class_0000" / "broken.jpg") << "this is not a jpeg";
  std::ofstream(d.p / "class_0001" / "empty.jpg");
  {  // a JPEG cut off after its header
    std::ifstream in(d.p / "class_0001" / "img_0000001.jpg", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(d.p / "class_0001" / "truncated.jpg", std::ios::binary) << bytes.substr(0, 300);
  }
  PipelineOptions o;
  o.batch = 5;
  o.image_size = 24;
  o.threads = 2;
  o.prefetch = 2;
  ImagePipeline p(scan_image_folder(d.str()), o);
  for (int k = 0; k < 8; ++k) {  // 40 images: more than three epochs of 15 files
    auto b = p.next();
    ASSERT_EQ(b->labels.size(), 5u);
    EXPECT_FALSE(b->pinned());  // no backend given: plain memory
    for (auto l : b->labels) EXPECT_TRUE(l == 0 || l == 1);
    for (float v : b->images) ASSERT_TRUE(std::isfinite(v));
    p.recycle(std::move(b));
  }
  EXPECT_GE(p.skipped(), 2u);  // the broken and empty files at least once (truncated JPEGs may decode partly)
  EXPECT_GE(p.decoded(), 40u);
  bool named = false;
  for (const auto& s : p.skipped_examples())
    named |= s.find("broken.jpg") != std::string::npos || s.find("empty.jpg") != std::string::npos;
  EXPECT_TRUE(named);
}

// Every image arrives with its own label: a folder whose class 0 is red and class 1 blue (3 and 4
// files, shuffled), read over several epochs by 2 threads; in each image red outweighs blue exactly
// when its label is 0. (A label taken by the image's place in the epoch, not its file, fails.)
TEST(Data, EveryImageArrivesWithItsOwnLabel) {
  test::TempDir d("data");
  fs::create_directories(d.p / "class_0000");
  fs::create_directories(d.p / "class_0001");
  for (int i = 0; i < 3; ++i) write_solid_jpeg(d.p / "class_0000" / fmt::format("r{}.jpg", i), 40, 30, 220, 20, 20);
  for (int i = 0; i < 4; ++i) write_solid_jpeg(d.p / "class_0001" / fmt::format("b{}.jpg", i), 40, 30, 20, 20, 220);
  PipelineOptions o;
  o.batch = 3;
  o.image_size = 16;
  o.threads = 2;
  o.prefetch = 2;
  ImagePipeline p(scan_image_folder(d.str()), o);
  const std::size_t plane = 16 * 16;
  int seen[2] = {0, 0};
  for (int k = 0; k < 10; ++k) {  // 30 images: over four epochs of 7
    auto b = p.next();
    for (std::size_t i = 0; i < b->labels.size(); ++i) {
      const float* img = b->images.data() + i * 3 * plane;  // NCHW
      double red = 0, blue = 0;
      for (std::size_t j = 0; j < plane; ++j) red += img[j], blue += img[2 * plane + j];
      const int label = b->labels[i];
      ASSERT_TRUE(label == 0 || label == 1);
      EXPECT_EQ(label == 0, red > blue) << "batch " << k << ", image " << i << ": label " << label;
      ++seen[label];
    }
    p.recycle(std::move(b));
  }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
}

TEST(Data, AFolderOfOnlyCorruptFilesIsAnErrorNotAHang) {
  test::TempDir d("data");
  fs::create_directories(d.p / "a");
  for (int i = 0; i < 3; ++i) std::ofstream(d.p / "a" / fmt::format("x{}.jpg", i)) << "garbage";
  PipelineOptions o;
  o.batch = 2;
  o.image_size = 8;
  ImagePipeline p(scan_image_folder(d.str()), o);
  EXPECT_THROW(p.next(), Error);
}

TEST(Data, BadThreadCountsAreUsageErrors) {
  test::TempDir d("data");
  make_dataset(d.str(), 2, 1, 32, 32);
  PipelineOptions o;
  o.threads = 0;
  EXPECT_THROW(ImagePipeline(scan_image_folder(d.str()), o), UsageError);
}

}  // namespace
}  // namespace stepbench
