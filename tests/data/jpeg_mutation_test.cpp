// Untrusted JPEG files (decode_crop_normalise): every truncation, a bit flipped in every byte, and
// headers that claim huge or zero sizes end in a decoded image or a clear reason, never a crash, a
// hang, a read outside the file or an allocation the file cannot justify (ASan builds check the
// reads). The seed image is made here, so the corpus is the code.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/data.hpp"

namespace stepbench {
namespace {
namespace fs = std::filesystem;

std::vector<unsigned char> seed_jpeg(int w, int h, int subsamp) {
  std::vector<unsigned char> rgb(static_cast<std::size_t>(w) * h * 3);
  for (std::size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<unsigned char>(127 + 120 * std::sin(0.05 * i));
  tjhandle tj = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &jpeg, &size, subsamp, 90, 0), 0);
  std::vector<unsigned char> out(jpeg, jpeg + size);
  tjFree(jpeg);
  tjDestroy(tj);
  return out;
}

struct Decoder {
  fs::path path = fs::temp_directory_path() / ("stepbench-jpeg-mutation-" + std::to_string(getpid()) + ".jpg");
  PipelineOptions o;
  std::vector<float> dst;
  Decoder() {
    o.image_size = 16;
    dst.resize(3 * 16 * 16);
  }
  ~Decoder() { fs::remove(path); }
  // true: decoded (every value finite); false: refused with a reason
  bool operator()(const std::vector<unsigned char>& bytes, std::string& why) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    why.clear();
    const bool ok = decode_crop_normalise(path.string(), dst.data(), o, 7, why);
    if (ok)
      for (float v : dst) EXPECT_TRUE(std::isfinite(v));
    else
      EXPECT_FALSE(why.empty());
    return ok;
  }
};

TEST(JpegMutation, EveryTruncationDecodesOrSaysWhy) {
  Decoder dec;
  for (int sub : {TJSAMP_444, TJSAMP_420}) {
    const auto jpeg = seed_jpeg(40, 24, sub);
    std::string why;
    SCOPED_TRACE(sub == TJSAMP_444 ? "4:4:4" : "4:2:0");
    ASSERT_TRUE(dec(jpeg, why)) << why;  // also after the other seed's damaged files
    int refused = 0;
    for (std::size_t n = 0; n < jpeg.size(); ++n) {
      const std::vector<unsigned char> cut(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(n));
      refused += !dec(cut, why);
    }
    EXPECT_GT(refused, 0);  // the header's truncations at least
  }
}

TEST(JpegMutation, ABitFlippedInAnyByteDecodesOrSaysWhy) {
  Decoder dec;
  const auto jpeg = seed_jpeg(40, 24, TJSAMP_420);
  std::string why;
  for (std::size_t i = 0; i < jpeg.size(); ++i) {
    auto bad = jpeg;
    bad[i] ^= static_cast<unsigned char>(1u << (i % 8));
    dec(bad, why);
  }
}

TEST(JpegMutation, AHeaderClaimingHugeDimensionsIsRefusedWithoutAllocatingThem) {
  Decoder dec;
  auto jpeg = seed_jpeg(40, 24, TJSAMP_444);
  // the SOF0 marker (FF C0): length (2), precision (1), height (2), width (2)
  std::size_t sof = 0;
  for (std::size_t i = 0; i + 1 < jpeg.size(); ++i)
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      sof = i;
      break;
    }
  ASSERT_GT(sof, 0u);
  for (const auto& [h, w] : {std::pair{65535, 65535}, std::pair{65000, 1}, std::pair{1, 65000}, std::pair{0, 40}}) {
    SCOPED_TRACE(fmt::format("{} x {}", w, h));
    auto bad = jpeg;
    bad[sof + 5] = static_cast<unsigned char>(h >> 8);
    bad[sof + 6] = static_cast<unsigned char>(h & 0xFF);
    bad[sof + 7] = static_cast<unsigned char>(w >> 8);
    bad[sof + 8] = static_cast<unsigned char>(w & 0xFF);
    std::string why;
    if (w * static_cast<long long>(h) > 1000000) {
      EXPECT_FALSE(dec(bad, why));  // 12.9 GB of RGB claimed by a 1 kB file
      EXPECT_NE(why.find("pixels"), std::string::npos) << why;
    } else {
      dec(bad, why);
    }
  }
}

}  // namespace
}  // namespace stepbench
