// Input pipelines: the JPEG folder scan, decode + random-resized-crop + normalisation, the
// threaded pipeline with corrupt files, and the errors for missing or empty folders.
#include <fmt/format.h>
#include <turbojpeg.h>
#include <unistd.h>

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
