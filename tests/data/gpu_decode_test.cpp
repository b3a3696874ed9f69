// --decode gpu (backend.hpp's ImageDecodeOp; the cuda backend's nvJPEG and transform kernels), where
// a GPU is visible: the device's transforms against the CPU pipeline's, bit for bit from the same
// decoded pixels; nvJPEG's decode against libjpeg-turbo's, within the two decoders' difference;
// a damaged file in a batch named, the others decoded as alone; the pipeline fed through it. Without
// a GPU: the refusals.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "backend/registry.hpp"
#include "data/data.hpp"
#include "support/test_util.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

namespace fs = std::filesystem;

struct Folder {
  fs::path dir;
  ImageFolder folder;
  Folder(int images, int w, int h, std::uint64_t seed) {
    dir = fs::temp_directory_path() / fmt::format("stepbench_gpudecode_{}_{}x{}_{}", ::getpid(), w, h, seed);
    make_dataset(dir.string(), static_cast<std::size_t>(images), 2, w, h, ImageFormat::jpeg, seed);
    folder = scan_image_folder(dir.string());
  }
  ~Folder() { fs::remove_all(dir); }
};

std::unique_ptr<Backend> gpu_or_skip(std::string& why) {
  why = cuda_unavailable_reason();
  if (!why.empty()) return nullptr;
  return make_backend(test::gpu_options());
}

PipelineOptions decode_options(Layout l) {
  PipelineOptions o;
  o.image_size = 64;
  o.layout = l;
  return o;
}
ImageDecodeParams decode_params(const PipelineOptions& o, int batch, bool hardware = false) {
  ImageDecodeParams p;
  p.batch = batch;
  p.hardware = hardware;  // the GPU's JPEG engines where it has them; the hybrid backend by default here
  p.store = default_store_size(o.image_size);
  p.size = static_cast<int>(o.image_size);
  std::copy(std::begin(o.mean), std::end(o.mean), std::begin(p.mean));
  std::copy(std::begin(o.stddev), std::end(o.stddev), std::begin(p.stddev));
  return p;
}

// The CPU pipeline's image for each file (its crop from the seed), and the crops it drew.
std::vector<float> cpu_batch(const std::vector<std::vector<unsigned char>>& files, const PipelineOptions& o,
                             std::vector<ImageCrop>& crops) {
  const int R = default_store_size(o.image_size), S = static_cast<int>(o.image_size);
  const std::size_t floats = static_cast<std::size_t>(3 * S * S);
  std::vector<float> out(files.size() * floats), crop(floats);
  crops.clear();
  for (std::size_t i = 0; i < files.size(); ++i) {
    Image8 im;
    std::string why;
    EXPECT_TRUE(decode_image(files[i].data(), files[i].size(), im, why)) << why;
    std::vector<unsigned char> stored;
    resize_to_store(im, R, stored);
    const CropBox b = random_crop_box(R, o, 1000 + i);
    crops.push_back({b.x, b.y, b.w, b.h, b.flip});
    crop_resize(stored.data(), R, b, S, crop.data());
    flip_normalise(crop.data(), S, b.flip, o.layout, o, out.data() + i * floats);
  }
  return out;
}

std::vector<float> download(Backend& be, const Buffer& b, std::size_t floats) {
  std::vector<float> v(floats);
  be.copy(be.default_stream(), v.data(), b.get(), floats * sizeof(float));
  be.synchronize(be.default_stream());
  return v;
}

std::vector<std::vector<unsigned char>> read_all(const ImageFolder& f) {
  std::vector<std::vector<unsigned char>> v(f.files.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::string why;
    EXPECT_TRUE(read_file(f.files[i], v[i], why)) << why;
  }
  return v;
}

TEST(GpuDecode, RefusedWithoutAGpuBackend) {
  auto cpu = make_backend(BackendOptions{});
  try {
    cpu->make_image_decoder(ImageDecodeParams{});
    FAIL() << "the cpu backend made an image decoder";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("use --backend cuda"), std::string::npos) << e.what();
  }
}

TEST(GpuDecode, PngFoldersAndCachesAreRefused) {
  const auto dir = fs::temp_directory_path() / fmt::format("stepbench_gpudecode_png_{}", ::getpid());
  make_dataset(dir.string(), 4, 2, 40, 30, ImageFormat::png);
  PipelineOptions o = decode_options(Layout::nchw);
  o.encoded = true;
  try {
    ImagePipeline p(scan_image_folder(dir.string()), o);
    FAIL() << "an encoded pipeline over PNG files";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("4 PNG files"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Decoded once on the CPU, transformed on the GPU and on the CPU: the same floats. Sizes that shrink
// (antialiased), grow (bilinear) and are not square either way; both layouts.
TEST(GpuDecode, TransformsEqualTheCpusBitForBit) {
  std::string why;
  auto gpu = gpu_or_skip(why);
  if (!gpu) GTEST_SKIP() << why;
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{500, 375}, {61, 90}, {1200, 300}}) {
    Folder f(4, w, h, 7);
    const auto files = read_all(f.folder);
    for (Layout l : {Layout::nchw, Layout::nhwc}) {
      SCOPED_TRACE(fmt::format("{}x{} {}", w, h, to_string(l)));
      const PipelineOptions o = decode_options(l);
      std::vector<ImageCrop> crops;
      const auto want = cpu_batch(files, o, crops);
      auto dec = gpu->make_image_decoder(decode_params(o, 4));
      std::vector<Image8> ims(files.size());
      std::vector<HostRgb> rgb;
      for (std::size_t i = 0; i < files.size(); ++i) {
        ASSERT_TRUE(decode_image(files[i].data(), files[i].size(), ims[i], why)) << why;
        rgb.push_back({ims[i].px.data(), ims[i].w, ims[i].h});
      }
      Buffer out(*gpu, want.size() * sizeof(float));
      gpu->fill(gpu->default_stream(), out.as<float>(), NAN, want.size());  // every element must be written
      const TensorDesc d = TensorDesc::dense({4, 3, o.image_size, o.image_size}, DType::f32, l);
      dec->transform(gpu->default_stream(), rgb, crops, {3, 0, 2, 1}, Tensor{out.get(), d});  // any slots
      const auto got = download(*gpu, out, want.size());
      const std::size_t per = want.size() / 4;
      const int slot_of[4] = {3, 0, 2, 1};
      for (std::size_t i = 0; i < 4; ++i) {
        const float* a = got.data() + static_cast<std::size_t>(slot_of[i]) * per;
        const float* b = want.data() + i * per;
        std::size_t differ = 0, first = per;
        for (std::size_t k = 0; k < per; ++k)
          if (std::memcmp(&a[k], &b[k], sizeof(float)) != 0) ++differ, first = std::min(first, k);
        EXPECT_EQ(differ, 0u) << "image " << i << ": " << differ << " of " << per << " floats differ, the first at "
                              << first << " (" << (first < per ? a[first] : 0) << " vs " << (first < per ? b[first] : 0)
                              << ")";
      }
    }
  }
}

// GPUs with JPEG engines (NVJPG), by name
constexpr const char* kEngines[] = {"A100", "A30", "H100", "H200", "H800", "GH200"};

// nvJPEG against libjpeg-turbo (TJFLAG_FASTDCT, fancy upsampling) on the same files, through the same
// transforms: the difference, in 8-bit levels of the normalised output, is the decoders' alone.
TEST(GpuDecode, NvJpegAgainstLibjpegTurbo) {
  std::string why;
  auto gpu = gpu_or_skip(why);
  if (!gpu) GTEST_SKIP() << why;
  Folder f(8, 500, 375, 3);
  const auto files = read_all(f.folder);
  const PipelineOptions o = decode_options(Layout::nhwc);
  std::vector<ImageCrop> crops;
  const auto want = cpu_batch(files, o, crops);
  for (bool hardware : {false, true}) {
    auto dec = gpu->make_image_decoder(decode_params(o, 8, hardware));
    Buffer out(*gpu, want.size() * sizeof(float));
    gpu->fill(gpu->default_stream(), out.as<float>(), NAN, want.size());
    std::vector<std::pair<const unsigned char*, std::size_t>> in;
    for (const auto& v : files) in.emplace_back(v.data(), v.size());
    const TensorDesc d = TensorDesc::dense({8, 3, o.image_size, o.image_size}, DType::f32, Layout::nhwc);
    const auto errs = dec->decode(gpu->default_stream(), in, crops, Tensor{out.get(), d});
    for (const auto& e : errs) EXPECT_EQ(e, "");
    std::cout << "decoder: " << dec->library() << "\n";
    const std::string dev = gpu->device_name();
    const bool engines = std::any_of(std::begin(kEngines), std::end(kEngines),
                                     [&](const char* g) { return dev.find(g) != std::string::npos; });
    if (hardware && engines) {  // these GPUs have JPEG engines: they must open
      EXPECT_NE(dec->library().find("the hardware decoder ("), std::string::npos) << dev << ": " << dec->library();
    }
    if (dec->library().find("the hardware decoder") != std::string::npos)  // baseline 4:2:0: the engines take all
      EXPECT_NE(dec->library().find("(8 of 8 images on the hardware decoder)"), std::string::npos) << dec->library();
    else
      EXPECT_EQ(dec->library().find("images on the hardware decoder"), std::string::npos) << dec->library();
    const auto got = download(*gpu, out, want.size());
    double sum = 0, worst = 0;
    std::size_t nan = 0;
    std::vector<double> diffs;
    for (std::size_t k = 0; k < got.size(); ++k) {
      if (!std::isfinite(got[k])) ++nan;
      const double levels = std::abs(got[k] - want[k]) * 255.0 * o.stddev[k % 3];  // NHWC: channel k % 3
      sum += levels;
      worst = std::max(worst, levels);
      diffs.push_back(levels);
    }
    std::sort(diffs.begin(), diffs.end());
    const double mean = sum / static_cast<double>(got.size()), p99 = diffs[diffs.size() * 99 / 100];
    std::cout << fmt::format(
        "nvJPEG - libjpeg-turbo, 8-bit levels: mean {:.3f}, 99th percentile {:.2f}, largest {:.2f}\n", mean, p99,
        worst);
    EXPECT_EQ(nan, 0u) << "unwritten outputs";
    EXPECT_LT(mean, 2.0);  // another image, or channels swapped, is tens of levels off
    EXPECT_LT(p99, 8.0);
    EXPECT_LT(worst, 48.0);
  }
}

// A damaged file in the middle of a batch: named, its slot left alone, and the others what they are
// decoded without it. On the hybrid backend exactly so; on the GPU's JPEG engines (which decode
// asynchronously, and may take a damaged file without a word) the others must decode and come
// within nvJPEG's bounds, and what became of the damaged file is printed.
TEST(GpuDecode, ADamagedFileIsNamedAndTheOthersDecode) {
  std::string why;
  auto gpu = gpu_or_skip(why);
  if (!gpu) GTEST_SKIP() << why;
  Folder f(3, 200, 150, 5);
  auto files = read_all(f.folder);
  auto bad = files[1];
  for (std::size_t k = bad.size() / 3; k < bad.size() - 2; ++k) bad[k] = static_cast<unsigned char>(k * 37);
  const PipelineOptions o = decode_options(Layout::nchw);
  std::vector<ImageCrop> crops;
  cpu_batch(files, o, crops);
  for (bool hardware : {false, true}) {
    auto dec = gpu->make_image_decoder(decode_params(o, 3, hardware));
    const std::size_t per = static_cast<std::size_t>(3 * o.image_size * o.image_size);
    auto run = [&](const std::vector<std::vector<unsigned char>>& v, std::vector<std::string>* errs) {
      Buffer out(*gpu, 3 * per * sizeof(float));
      gpu->fill(gpu->default_stream(), out.as<float>(), -7.0f, 3 * per);
      std::vector<std::pair<const unsigned char*, std::size_t>> in;
      for (const auto& x : v) in.emplace_back(x.data(), x.size());
      const TensorDesc d = TensorDesc::dense({3, 3, o.image_size, o.image_size}, DType::f32, Layout::nchw);
      *errs = dec->decode(gpu->default_stream(), in, {crops.begin(), crops.begin() + static_cast<long>(v.size())},
                          Tensor{out.get(), d});
      return download(*gpu, out, 3 * per);
    };
    std::vector<std::string> errs;
    const auto good = run(files, &errs);
    for (const auto& e : errs) EXPECT_EQ(e, "");
    EXPECT_EQ(dec->library().find("fell back"), std::string::npos) << dec->library();
    const auto mixed = run({files[0], bad, files[2]}, &errs);
    std::cout << (hardware ? "hardware asked" : "hybrid") << ": the damaged file: \"" << errs[1]
              << "\"; the decoder: " << dec->library() << "\n";
    EXPECT_EQ(errs[0], "");
    EXPECT_EQ(errs[2], "");
    double worst = 0, sum = 0;
    for (std::size_t k = 0; k < per; ++k) {
      for (std::size_t i : {std::size_t{0}, 2 * per}) {
        const double d = std::abs(good[i + k] - mixed[i + k]);
        worst = std::max(worst, d);
        sum += d;
      }
    }
    const double level = 1.0 / (255.0 * 0.225);
    std::cout << "the others against the whole batch's: largest difference " << worst / level << " levels, mean "
              << sum / (2.0 * static_cast<double>(per)) / level << "\n";
    if (hardware) {  // the engines' batch against the hybrid backend's, maybe: nvJPEG's bounds
      EXPECT_LT(worst, 48 * level);
      EXPECT_LT(sum / (2.0 * static_cast<double>(per)), 2 * level);
      continue;
    }
    if (errs[1].rfind("nvJPEG could not decode it", 0) == 0) {  // the batch failed, then the file alone: said
      EXPECT_NE(dec->library().find("1 of 2 batches fell back"), std::string::npos) << dec->library();
    }
    // a spoilt batch is decoded file by file, which nvJPEG need not do bit for bit as the batch: 2 levels
    EXPECT_LE(worst, 2 * level);
    if (!errs[1].empty()) {  // refused: its slot as it was
      EXPECT_TRUE(std::all_of(mixed.begin() + static_cast<long>(per), mixed.begin() + static_cast<long>(2 * per),
                              [](float v) { return v == -7.0f; }));
    }
  }
}

// The pipeline with encoded batches: the files' bytes and the crops the plain pipeline draws.
TEST(GpuDecode, EncodedBatchesCarryTheFilesAndThePlainPipelinesCrops) {
  Folder f(6, 120, 90, 9);
  PipelineOptions o = decode_options(Layout::nchw);
  o.batch = 3;
  o.threads = 1;
  PipelineOptions e = o;
  e.encoded = true;
  ImagePipeline enc(f.folder, e);
  auto b = enc.next();
  ASSERT_EQ(b->files.size(), 3u);
  EXPECT_TRUE(b->images.empty());
  const int R = default_store_size(o.image_size);
  std::vector<unsigned char> want;
  std::string why;
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(read_file(enc.file_name(b->items[i]), want, why)) << why;
    EXPECT_EQ(b->files[i], want) << i;
    const auto& c = b->crops[i];
    EXPECT_TRUE(c.w > 0 && c.h > 0 && c.x + c.w <= R && c.y + c.h <= R) << i;
  }
  // the plain pipeline's first batch: the same images, labels and crops (decoded and transformed
  // on the CPU with the encoded batch's crops, bit for bit)
  ImagePipeline plain(f.folder, o);
  auto p = plain.next();
  const int S = static_cast<int>(o.image_size);
  const std::size_t per = static_cast<std::size_t>(3 * S * S);
  std::vector<float> crop(per), img(per);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b->labels[i], p->labels[i]) << i;
    Image8 im;
    ASSERT_TRUE(decode_image(b->files[i].data(), b->files[i].size(), im, why)) << why;
    std::vector<unsigned char> stored;
    resize_to_store(im, R, stored);
    const auto& c = b->crops[i];
    const CropBox box{c.x, c.y, c.w, c.h, c.flip};
    crop_resize(stored.data(), R, box, S, crop.data());
    flip_normalise(crop.data(), S, box.flip, o.layout, o, img.data());
    EXPECT_TRUE(std::equal(img.begin(), img.end(), p->images.begin() + static_cast<long>(i * per))) << i;
  }
}

}  // namespace
}  // namespace stepbench
