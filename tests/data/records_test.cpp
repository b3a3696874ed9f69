// Record files and the memory cache: the same batches bit for bit as the plain pipeline (same seed,
// so the same crops and flips), record files that are damaged or truncated refused with a reason,
// a cache that does not fit refused at start with its bytes, and the stage times accounting for
// the threads' time.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/data.hpp"
#include "support/temp_dir.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {
namespace fs = std::filesystem;

PipelineOptions records_options(Layout layout) {
  PipelineOptions o;
  o.batch = 3;
  o.image_size = 24;
  o.threads = 1;  // one thread: the batches come out in ticket order
  o.prefetch = 2;
  o.seed = 7;
  o.layout = layout;
  return o;
}

std::vector<std::vector<float>> batches(ImagePipeline& p, int n, std::vector<std::int32_t>* labels = nullptr) {
  std::vector<std::vector<float>> out;
  for (int i = 0; i < n; ++i) {
    auto b = p.next();
    out.emplace_back(b->images.begin(), b->images.end());
    if (labels) labels->insert(labels->end(), b->labels.begin(), b->labels.end());
    p.recycle(std::move(b));
  }
  return out;
}

TEST(Records, CacheAndRecordsGiveThePlainPipelinesBatchesBitForBit) {
  test::TempDir d("records");
  make_dataset((d.p / "png").string(), 5, 2, 45, 33, ImageFormat::png);
  make_dataset((d.p / "png").string() + "/../jpg", 4, 2, 33, 45, ImageFormat::jpeg, 3);
  for (const auto& e : fs::recursive_directory_iterator(d.p / "jpg"))
    if (e.is_regular_file())
      fs::copy_file(e.path(), d.p / "png" / e.path().parent_path().filename() / e.path().filename());
  const ImageFolder f = scan_image_folder((d.p / "png").string());
  ASSERT_EQ(f.files.size(), 9u);
  const auto rec = (d.p / "all.records").string();
  const RecordsWritten w = write_records(f, rec, default_store_size(24), 2);
  EXPECT_EQ(w.images, 9u);
  EXPECT_EQ(w.skipped, 0u);
  auto records = std::make_shared<const RecordFile>(rec);
  EXPECT_EQ(records->size(), 9u);
  EXPECT_EQ(records->store_size(), default_store_size(24));
  EXPECT_EQ(records->classes(), f.classes);
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    std::vector<std::int32_t> l_plain, l_cache, l_rec;
    ImagePipeline plain(f, records_options(layout));
    PipelineOptions oc = records_options(layout);
    oc.cache = InputCache::memory;
    ImagePipeline cached(f, oc);
    ImagePipeline from_records(records, records_options(layout));
    const auto a = batches(plain, 7, &l_plain);  // 21 images: more than two epochs
    const auto b = batches(cached, 7, &l_cache);
    const auto c = batches(from_records, 7, &l_rec);
    EXPECT_EQ(cached.cache_bytes(), 9u * default_store_size(24) * default_store_size(24) * 3);
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4), 0) << "cache, batch " << i;
      ASSERT_EQ(std::memcmp(a[i].data(), c[i].data(), a[i].size() * 4), 0) << "records, batch " << i;
    }
    EXPECT_EQ(l_plain, l_cache);
    EXPECT_EQ(l_plain, l_rec);
    // and a different seed gives different crops
    PipelineOptions o2 = records_options(layout);
    o2.seed = 8;
    ImagePipeline other(f, o2);
    EXPECT_NE(batches(other, 1)[0], a[0]);
  }
}

TEST(Records, ACacheThatDoesNotFitIsRefusedAtStartWithItsBytes) {
  test::TempDir d("records");
  make_dataset(d.p.string(), 4, 1, 40, 30);
  PipelineOptions o = records_options(Layout::nchw);
  o.cache = InputCache::memory;
  o.cache_limit_bytes = 1000;  // 4 x 27 x 27 x 3 = 8748 bytes needed
  try {
    ImagePipeline p(scan_image_folder(d.p.string()), o);
    FAIL() << "the cache must be refused";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("needs 0.0 MiB (4 images of 27x27x3 bytes)"), std::string::npos) << m;
    EXPECT_NE(m.find("make-records"), std::string::npos) << m;
  }
}

TEST(Records, DamagedTruncatedAndForeignFilesAreRefusedWithTheReason) {
  test::TempDir d("records");
  make_dataset((d.p / "ds").string(), 3, 1, 20, 20);
  const auto rec = (d.p / "r.records").string();
  write_records(scan_image_folder((d.p / "ds").string()), rec, 16, 1);
  EXPECT_TRUE(RecordFile::looks_like_records(rec));
  EXPECT_FALSE(fs::exists(rec + ".partial"));
  std::ifstream in(rec, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto refused = [&](const std::string& content, const std::string& words) {
    const auto p = (d.p / "bad.records").string();
    std::ofstream(p, std::ios::binary | std::ios::trunc) << content;
    try {
      RecordFile r(p);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(bytes.substr(0, bytes.size() - 1), "truncated");
  refused(bytes.substr(0, 40), "shorter than its header");
  refused("not a record file at all, but long enough to hold a header of sixty-four bytes.", "no SBREC01 signature");
  std::string damaged = bytes;
  damaged[16] = 3;  // R = 3
  refused(damaged, "header is damaged");
  std::string label = bytes;
  label[label.size() - 4] = 9;  // the last label: 9 of 1 class
  refused(label, "has label 9 of 1 classes");
  // offsets chosen so that images_off + count * R*R*3 wraps around 2^64 to a small labels_off
  std::string crafted(216, '\0');
  auto put = [&](std::size_t at, std::uint64_t v, int n) {
    std::memcpy(&crafted[at], &v, static_cast<std::size_t>(n));
  };
  std::memcpy(&crafted[0], "SBREC01\n", 8);
  put(8, 22, 8);                         // count
  put(16, 8, 4);                         // R
  put(20, 1, 4);                         // classes
  put(24, 64, 8);                        // names_off
  put(32, 2, 8);                         // names_bytes
  put(40, ~std::uint64_t{0} - 4095, 8);  // images_off = 2^64 - 4096
  put(48, 128, 8);                       // labels_off
  crafted[64] = 'a';
  refused(crafted, "header is damaged");
  EXPECT_FALSE(RecordFile::looks_like_records((d.p / "ds").string()));
  EXPECT_THROW(write_records(scan_image_folder((d.p / "ds").string()), (d.p / "no/such/dir/x").string(), 16, 1),
               UsageError);
}

TEST(Records, BadThreadCountsAreUsageErrorsBeforeTheCacheFills) {
  test::TempDir d("records");
  make_dataset(d.p.string(), 2, 1, 20, 20);
  for (int threads : {0, -3}) {
    PipelineOptions o = records_options(Layout::nchw);
    o.threads = threads;
    o.cache = InputCache::memory;
    EXPECT_THROW(ImagePipeline(scan_image_folder(d.p.string()), o), UsageError) << threads;
  }
}

TEST(Records, TheStageTimesAccountForTheThreadsTime) {
  test::TempDir d("records");
  make_dataset(d.p.string(), 24, 2, 160, 120, ImageFormat::png);
  PipelineOptions o = records_options(Layout::nchw);
  o.batch = 4;
  o.image_size = 64;
  o.threads = 2;
  ImagePipeline p(scan_image_folder(d.p.string()), o);
  p.recycle(p.next());
  const StageTimes a = p.stage_times();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 12; ++i) {
    p.recycle(p.next());
    std::this_thread::sleep_for(std::chrono::milliseconds(i % 2 ? 0 : 3));  // some waiting for room too
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const StageTimes t = p.stage_times() - a;
  EXPECT_GT(t[Stage::decode], 0);
  EXPECT_GT(t[Stage::resize], 0);
  EXPECT_GT(t[Stage::crop], 0);
  EXPECT_GT(t.images, 0u);
  // every moment of both threads is a stage (ended or in progress) or a wait for room, within 5%
  EXPECT_NEAR((t.busy() + t.open + t.idle) / (2 * wall), 1.0, 0.05)
      << "busy " << t.busy() << " idle " << t.idle << " wall " << wall;
}

}  // namespace
}  // namespace stepbench
