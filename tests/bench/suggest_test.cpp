// --suggest (bench/suggest.hpp) and the verdict's remedy (bench/input_report.hpp) on the CPU: the
// rows each configuration gets, the --decode gpu rows through a stand-in decoder (the CPU's decode
// and transforms behind backend.hpp's ImageDecodeOp, so the device path's plumbing runs without a
// GPU), decode_on_device's batch against the plain pipeline's, and which remedy the verdict names.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/registry.hpp"
#include "bench/input_report.hpp"
#include "bench/suggest.hpp"
#include "data/augment.hpp"
#include "data/data.hpp"

namespace stepbench {
namespace {

namespace fs = std::filesystem;

struct SuggestFolder {
  fs::path dir;
  ImageFolder folder;
  SuggestFolder(const char* tag, int images, ImageFormat format) {
    dir = fs::temp_directory_path() / fmt::format("stepbench_suggest_{}_{}", tag, ::getpid());
    make_dataset(dir.string(), static_cast<std::size_t>(images), 2, 80, 60, format, 7);
    folder = scan_image_folder(dir.string());
  }
  ~SuggestFolder() { fs::remove_all(dir); }
};

PipelineOptions suggest_options() {
  PipelineOptions o;
  o.batch = 4;
  o.image_size = 32;
  o.threads = 1;
  o.prefetch = 2;
  o.seed = 11;
  return o;
}

// The CPU's decode and transforms as an ImageDecodeOp. refuse_every: every k-th file of a call is
// "refused by the device", as nvJPEG refuses some files, so decode_on_device decodes it on the CPU.
struct CpuDecoder final : ImageDecodeOp {
  ImageDecodeParams p;
  PipelineOptions o;
  int refuse_every = 0;
  std::atomic<long>* calls;
  CpuDecoder(const ImageDecodeParams& params, Layout layout, int refuse, std::atomic<long>* n)
      : p(params), refuse_every(refuse), calls(n) {
    o.layout = layout;
    std::copy(std::begin(p.mean), std::end(p.mean), std::begin(o.mean));
    std::copy(std::begin(p.stddev), std::end(p.stddev), std::begin(o.stddev));
  }
  std::string library() const override { return "the CPU standing in for nvJPEG"; }
  void one(const Image8& img, const ImageCrop& c, int slot, const Tensor& out) {
    std::vector<unsigned char> stored;
    resize_to_store(img, p.store, stored);
    std::vector<float> crop(static_cast<std::size_t>(3 * p.size * p.size));
    crop_resize(stored.data(), p.store, CropBox{c.x, c.y, c.w, c.h, c.flip}, p.size, crop.data());
    flip_normalise(crop.data(), p.size, c.flip, o.layout, o, static_cast<float*>(out.data) + slot * crop.size());
  }
  std::vector<std::string> decode(Stream&, const std::vector<std::pair<const unsigned char*, std::size_t>>& files,
                                  const std::vector<ImageCrop>& crops, const Tensor& out) override {
    ++*calls;
    std::vector<std::string> why(files.size());
    for (std::size_t i = 0; i < files.size(); ++i) {
      Image8 img;
      if (refuse_every > 0 && i % static_cast<std::size_t>(refuse_every) == 0)
        why[i] = "refused by the stand-in";
      else if (decode_image(files[i].first, files[i].second, img, why[i]))
        one(img, crops[i], static_cast<int>(i), out);
    }
    return why;
  }
  void transform(Stream&, const std::vector<HostRgb>& images, const std::vector<ImageCrop>& crops,
                 const std::vector<int>& slots, const Tensor& out) override {
    for (std::size_t k = 0; k < images.size(); ++k) {
      Image8 img;
      img.w = images[k].w;
      img.h = images[k].h;
      img.px.assign(images[k].px, images[k].px + static_cast<std::size_t>(img.w) * img.h * 3);
      one(img, crops[k], slots[k], out);
    }
  }
};

std::vector<std::string> names(const std::vector<RemedyRow>& rows) {
  std::vector<std::string> n;
  for (const auto& r : rows) n.push_back(r.name);
  return n;
}
const RemedyRow& find(const std::vector<RemedyRow>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return r;
  throw std::runtime_error("no row " + name);
}

TEST(Suggest, AFolderGetsEveryRemedyAndTheDecodeGpuRowRunsTheDecoder) {
  SuggestFolder f("jpeg", 40, ImageFormat::jpeg);
  auto be = make_backend(BackendOptions{});
  std::atomic<long> calls{0};
  const ImageDecoderMaker make = [&](const ImageDecodeParams& p) {
    return std::make_unique<CpuDecoder>(p, Layout::nchw, 3, &calls);
  };
  const auto rows = run_suggest(suggest_options(), f.folder, nullptr, *be, make);
  EXPECT_EQ(names(rows), (std::vector<std::string>{"as run", "--data-threads 2", "--cache memory",
                                                   "make-records, --data OUT.records", "--decode gpu"}));
  for (const auto& r : rows) EXPECT_GT(r.images_per_s, 0) << r.name << ": " << r.note;
  // 2 warm batches and at least 4 timed, each one call
  EXPECT_GE(calls.load(), 6);
  EXPECT_NE(find(rows, "--decode gpu").note.find("the CPU standing in for nvJPEG"), std::string::npos);
  EXPECT_TRUE(find(rows, "--decode gpu").on_device);
  EXPECT_TRUE(find(rows, "--cache memory").applies);  // 40 small images fit

  // run with --cache memory: what excludes the cache says so, and a cache-limit the folder passes
  PipelineOptions c = suggest_options();
  c.cache = InputCache::memory;
  const auto crows = run_suggest(c, f.folder, nullptr, *be, make);
  EXPECT_EQ(names(crows), (std::vector<std::string>{"as run (--cache memory)", "without the cache", "--data-threads 2",
                                                    "make-records, --data OUT.records (drop --cache)",
                                                    "--decode gpu (drop --cache)"}));
  PipelineOptions small = suggest_options();
  small.cache_limit_bytes = 1024;
  EXPECT_FALSE(find(run_suggest(small, f.folder, nullptr, *be, make), "--cache memory").applies);

  // run with --decode gpu: as run on the device, twice the reading threads, the CPU's decode
  PipelineOptions g = suggest_options();
  g.encoded = true;
  calls = 0;
  const auto grows = run_suggest(g, f.folder, nullptr, *be, make);
  EXPECT_EQ(names(grows), (std::vector<std::string>{"as run (--decode gpu)", "--data-threads 2", "--decode cpu",
                                                    "--decode cpu --cache memory",
                                                    "make-records, --data OUT.records (drop --decode gpu)"}));
  EXPECT_TRUE(grows[0].on_device && grows[1].on_device && !grows[2].on_device);
  for (const auto& r : grows) EXPECT_GT(r.images_per_s, 0) << r.name << ": " << r.note;
  EXPECT_GE(calls.load(), 12);  // two rows on the device
  EXPECT_NE(grows[0].note.find("40 files sampled of 40"), std::string::npos) << grows[0].note;
}

TEST(Suggest, TheDecodeGpuRowSaysWhyWhereItCannotRun) {
  auto be = make_backend(BackendOptions{});
  {  // the cpu backend's own decoder: none
    SuggestFolder f("cpu", 12, ImageFormat::jpeg);
    const auto rows = run_suggest(suggest_options(), f.folder, nullptr, *be,
                                  [&](const ImageDecodeParams& p) { return be->make_image_decoder(p); });
    const RemedyRow& r = find(rows, "--decode gpu");
    EXPECT_EQ(r.images_per_s, 0);
    EXPECT_NE(r.note.find("not measured"), std::string::npos) << r.note;
    EXPECT_NE(r.note.find("--backend cuda"), std::string::npos) << r.note;
  }
  {  // PNG files: nvJPEG decodes JPEG only
    SuggestFolder f("png", 12, ImageFormat::png);
    std::atomic<long> calls{0};
    const auto rows = run_suggest(suggest_options(), f.folder, nullptr, *be, [&](const ImageDecodeParams& p) {
      return std::make_unique<CpuDecoder>(p, Layout::nchw, 0, &calls);
    });
    const RemedyRow& r = find(rows, "--decode gpu");
    EXPECT_EQ(r.images_per_s, 0);
    EXPECT_NE(r.note.find("12 PNG files"), std::string::npos) << r.note;
    EXPECT_EQ(calls.load(), 0);
    EXPECT_GT(find(rows, "as run").images_per_s, 0);
  }
}

// decode_on_device writes what the plain pipeline makes, slot for slot, also for the files the
// device refused (decoded on the CPU, transformed by the decoder); a file neither can decode is
// counted as skipped and its slot zeroed.
TEST(Suggest, DecodeOnDeviceGivesThePlainPipelinesBatch) {
  SuggestFolder f("same", 16, ImageFormat::jpeg);
  auto be = make_backend(BackendOptions{});
  auto stream = be->create_stream();
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    PipelineOptions o = suggest_options();
    o.layout = l;
    ImagePipeline plain(f.folder, o);
    PipelineOptions e = o;
    e.encoded = true;
    ImagePipeline enc(f.folder, e);
    ImageDecodeParams dp;
    dp.batch = 4;
    dp.store = enc.store_size();
    dp.size = 32;
    std::copy(std::begin(o.mean), std::end(o.mean), std::begin(dp.mean));
    std::copy(std::begin(o.stddev), std::end(o.stddev), std::begin(dp.stddev));
    std::atomic<long> calls{0};
    CpuDecoder dec(dp, l, 2, &calls);
    const Shape shape{4, 3, 32, 32};
    std::vector<float> buf(static_cast<std::size_t>(shape.numel()), -7.0f);
    const Tensor out{buf.data(), TensorDesc::dense(shape, DType::f32, l)};
    for (int k = 0; k < 5; ++k) {  // over an epoch's end
      auto a = plain.next();
      auto b = enc.next();
      decode_on_device(dec, *be, *stream, *b, out, enc);
      ASSERT_EQ(std::memcmp(a->images.data(), buf.data(), buf.size() * sizeof(float)), 0) << "batch " << k;
      ASSERT_EQ(std::memcmp(a->labels.data(), b->labels.data(), 4 * sizeof(std::int32_t)), 0) << "batch " << k;
      // a batch whose second file is damaged (its header cut): neither the decoder nor the CPU decodes it
      if (k == 4) {
        b->files[1].resize(b->files[1].size() / 3);
        std::fill(b->files[1].begin() + 200, b->files[1].end(), 0xFF);
        decode_on_device(dec, *be, *stream, *b, out, enc);
        EXPECT_EQ(enc.skipped(), 1u);
        const auto ex = enc.skipped_examples();
        ASSERT_EQ(ex.size(), 1u);
        EXPECT_NE(ex[0].find("; on the CPU it is not a JPEG"), std::string::npos) << ex[0];
        const std::size_t per = 3 * 32 * 32;
        for (std::size_t i = 0; i < per; ++i) ASSERT_EQ(buf[per + i], 0.0f) << i;
      }
      plain.recycle(std::move(a));
      enc.recycle(std::move(b));
    }
    EXPECT_EQ(calls.load(), 6);
  }
}

InputMeasure decode_bound() {  // 4 threads, decode 80% of the work
  InputMeasure m;
  m.threads = 4;
  m.images = 1000;
  m.stages[Stage::read] = 0.1;
  m.stages[Stage::decode] = 0.8;
  m.stages[Stage::crop] = 0.05;
  m.stages[Stage::flip_normalise] = 0.05;
  return m;
}

TEST(Suggest, TheVerdictNamesTheRemedyMeasuredToKeepUp) {
  RemedyInputs in;
  in.measure = decode_bound();
  in.uncached_folder = true;
  in.cache_fits = true;
  in.step_ips = 3000;
  Remedy r = choose_remedy(in);  // estimated: the per-step stages alone, 4 x 1000 / 0.1
  EXPECT_EQ(r.name, "--cache memory");
  EXPECT_FALSE(r.measured);
  EXPECT_NEAR(r.ips, 40000, 1e-6);

  const std::string records = "make-records, --data OUT.records";
  in.rows = {{"as run", 1000, ""},
             {"--data-threads 8", 1900, ""},
             {"--cache memory", 3500, ""},
             {records, 3400, ""},
             {"--decode gpu", 5000, "", true, true}};
  r = choose_remedy(in);  // its own, measured, keeps up
  EXPECT_EQ(r.name, "--cache memory");
  EXPECT_TRUE(r.measured);
  EXPECT_EQ(r.ips, 3500);

  in.rows[2].images_per_s = 2500;  // the cache falls short: the first that keeps up, in the rows' order
  r = choose_remedy(in);
  EXPECT_EQ(r.name, records);
  EXPECT_EQ(r.ips, 3400);
  EXPECT_NE(r.why.find("--cache memory measured 2500"), std::string::npos) << r.why;
  EXPECT_EQ(r.why.find("timed on the GPU"), std::string::npos) << r.why;

  in.rows[3].images_per_s = 2000;
  r = choose_remedy(in);
  EXPECT_EQ(r.name, "--decode gpu");
  EXPECT_NE(r.why.find("timed on the GPU without the step"), std::string::npos) << r.why;

  in.rows[4] = {"--decode gpu", 0, "not measured: no GPU"};  // none keeps up: the fastest
  r = choose_remedy(in);
  EXPECT_EQ(r.name, "--cache memory");
  EXPECT_EQ(r.ips, 2500);

  in.processes = 2;  // the rows are one process's: 2 x 2500 keeps up with 3000
  r = choose_remedy(in);
  EXPECT_EQ(r.name, "--cache memory");
  EXPECT_EQ(r.ips, 5000);
  EXPECT_NE(r.why.find("x 2 processes"), std::string::npos) << r.why;
  in.rows[2].images_per_s = 1400;  // 2 x 1400 does not; 2 x 1900 does
  r = choose_remedy(in);
  EXPECT_EQ(r.name, "--data-threads 8");
  EXPECT_EQ(r.ips, 3800);

  in.processes = 1;
  const auto kept = in.rows;
  for (std::size_t i = 1; i < in.rows.size(); ++i) in.rows[i].images_per_s = std::min(in.rows[i].images_per_s, 900.0);
  r = choose_remedy(in);  // every remedy slower than the run: none named
  EXPECT_TRUE(r.name.empty());
  EXPECT_TRUE(r.measured);

  // a folder too big for the cache: its measured row is no candidate, however fast
  in.rows = kept;
  in.cache_fits = false;
  in.rows[2] = {"--cache memory", 9000, "refused", false};
  in.rows[3].images_per_s = 2900;
  r = choose_remedy(in);
  EXPECT_EQ(r.name, records);  // its own, the fastest that may run, though short of the step
  EXPECT_EQ(r.ips, 2900);
  in.rows[3].images_per_s = 0;
  r = choose_remedy(in);
  EXPECT_EQ(r.name, "--data-threads 8");
}

TEST(Suggest, WithDecodeGpuTheRemedyComesFromTheDevicesShare) {
  RemedyInputs in;
  in.gpu_decode = true;
  in.measure.threads = 2;
  in.measure.images = 1000;
  in.measure.stages[Stage::read] = 0.2;
  in.measure.stages[Stage::copy] = 0.5;  // the device's part, on the step's thread: 0.5 ms per image
  in.step_ips = 4000;
  Remedy r = choose_remedy(in);
  EXPECT_EQ(r.name, "make-records");
  EXPECT_TRUE(std::isnan(r.ips));  // not estimated
  const std::string records = "make-records, --data OUT.records (drop --decode gpu)";
  in.rows = {{"as run (--decode gpu)", 2000, "", true, true},
             {"--data-threads 4", 2100, "", true, true},
             {"--decode cpu", 800, ""},
             {"--decode cpu --cache memory", 3000, ""},
             {records, 4500, ""}};
  r = choose_remedy(in);
  EXPECT_EQ(r.name, records);
  EXPECT_TRUE(r.measured);
  EXPECT_EQ(r.ips, 4500);
  in.measure.stages[Stage::copy] = 0.01;  // reading limits it: more threads, but only measured 2100
  r = choose_remedy(in);
  EXPECT_EQ(r.name, records);
  EXPECT_NE(r.why.find("--data-threads 4 measured 2100"), std::string::npos) << r.why;
}

}  // namespace
}  // namespace stepbench
