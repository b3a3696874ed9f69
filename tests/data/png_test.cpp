// PNG decoding against known pixel values for every colour type and bit depth (the test writes its
// own PNGs with libpng), interlaced files, damaged and truncated files, PNGs and JPEGs mixed in one
// folder, and the resize stage against a naive double-precision reference.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <png.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "data/data.hpp"
#include "support/temp_dir.hpp"

namespace stepbench {
namespace {
namespace fs = std::filesystem;

struct Rgb {
  int r, g, b;
};

void write_mem(png_structp png, png_bytep data, png_size_t n) {
  auto* v = static_cast<std::vector<unsigned char>*>(png_get_io_ptr(png));
  v->insert(v->end(), data, data + n);
}
void flush_mem(png_structp) {}

// A w x h PNG of `type` and `depth` whose sample (x, y, channel) is sample(x, y, c), in the file's
// own units (0..2^depth-1, or a palette index), with the palette (and its tRNS alphas) given.
std::vector<unsigned char> make_png(int w, int h, int type, int depth, const std::function<int(int, int, int)>& sample,
                                    const std::vector<Rgb>& palette = {}, bool interlace = false) {
  std::vector<unsigned char> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    ADD_FAILURE() << "libpng could not write the test image";
    return {};
  }
  png_set_write_fn(png, &out, write_mem, flush_mem);
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), depth, type,
               interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> pal;
  std::vector<png_byte> alpha;
  for (std::size_t i = 0; i < palette.size(); ++i) {
    pal.push_back({static_cast<png_byte>(palette[i].r), static_cast<png_byte>(palette[i].g),
                   static_cast<png_byte>(palette[i].b)});
    alpha.push_back(static_cast<png_byte>(i * 60));  // some entries fully transparent: dropped, not composited
  }
  if (type == PNG_COLOR_TYPE_PALETTE) {
    png_set_PLTE(png, info, pal.data(), static_cast<int>(pal.size()));
    png_set_tRNS(png, info, alpha.data(), static_cast<int>(alpha.size()), nullptr);
  }
  const int channels = type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_PALETTE ? 1
                       : type == PNG_COLOR_TYPE_GRAY_ALPHA                           ? 2
                       : type == PNG_COLOR_TYPE_RGB                                  ? 3
                                                                                     : 4;
  const std::size_t rowbytes = (static_cast<std::size_t>(w) * channels * depth + 7) / 8;
  std::vector<unsigned char> rows(rowbytes * h, 0);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) {
        const int v = sample(x, y, c);
        unsigned char* row = rows.data() + rowbytes * y;
        const std::size_t bit = (static_cast<std::size_t>(x) * channels + c) * depth;
        if (depth == 16) {
          row[bit / 8] = static_cast<unsigned char>(v >> 8);
          row[bit / 8 + 1] = static_cast<unsigned char>(v & 255);
        } else if (depth == 8) {
          row[bit / 8] = static_cast<unsigned char>(v);
        } else {  // packed, the leftmost pixel in the high bits
          row[bit / 8] |= static_cast<unsigned char>(v << (8 - depth - bit % 8));
        }
      }
  std::vector<png_bytep> ptrs;
  for (int y = 0; y < h; ++y) ptrs.push_back(rows.data() + rowbytes * y);
  png_set_rows(png, info, ptrs.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

void expect_pixels(const std::vector<unsigned char>& file, int w, int h, const std::function<Rgb(int, int)>& want,
                   const std::string& what) {
  Image8 im;
  std::string why;
  ASSERT_TRUE(decode_image(file.data(), file.size(), im, why)) << what << ": " << why;
  ASSERT_EQ(im.w, w) << what;
  ASSERT_EQ(im.h, h) << what;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const unsigned char* p = &im.px[(static_cast<std::size_t>(y) * w + x) * 3];
      const Rgb e = want(x, y);
      ASSERT_EQ(p[0], e.r) << what << " at " << x << "," << y;
      ASSERT_EQ(p[1], e.g) << what << " at " << x << "," << y;
      ASSERT_EQ(p[2], e.b) << what << " at " << x << "," << y;
    }
}

constexpr int W = 7, H = 5;

TEST(Png, GreyAtEveryBitDepthIsReplicatedAndScaledTo8Bits) {
  for (int depth : {1, 2, 4, 8}) {
    const int top = (1 << depth) - 1;
    auto v = [&](int x, int y) { return (x + 3 * y) % (top + 1); };
    expect_pixels(
        make_png(W, H, PNG_COLOR_TYPE_GRAY, depth, [&](int x, int y, int) { return v(x, y); }), W, H,
        [&](int x, int y) {
          const int g = v(x, y) * 255 / top;  // 1, 2 and 4 bits scale by bit replication: exact multiples
          return Rgb{g, g, g};
        },
        fmt::format("grey {}-bit", depth));
  }
  // 16 bits: the high byte of each sample
  auto v16 = [](int x, int y) { return 0x1234 + x * 0x0f01 + y * 0x2003; };
  expect_pixels(
      make_png(W, H, PNG_COLOR_TYPE_GRAY, 16, [&](int x, int y, int) { return v16(x, y); }), W, H,
      [&](int x, int y) {
        return Rgb{v16(x, y) >> 8, v16(x, y) >> 8, v16(x, y) >> 8};
      },
      "grey 16-bit");
}

TEST(Png, RgbAndAlphaTypesAt8And16BitsDropTheAlpha) {
  auto s = [](int x, int y, int c) { return (x * 31 + y * 17 + c * 70) % 256; };
  auto alpha = [](int x) { return x == 0 ? 0 : 255 - x; };  // 0 at x = 0: dropped, not composited to black
  for (int depth : {8, 16}) {
    const int k = depth == 16 ? 257 : 1;  // 16-bit samples v * 257: the high byte is v
    auto rgb = [&](int x, int y) { return Rgb{s(x, y, 0), s(x, y, 1), s(x, y, 2)}; };
    expect_pixels(make_png(W, H, PNG_COLOR_TYPE_RGB, depth, [&](int x, int y, int c) { return s(x, y, c) * k; }), W, H,
                  rgb, fmt::format("RGB {}", depth));
    expect_pixels(make_png(W, H, PNG_COLOR_TYPE_RGB_ALPHA, depth,
                           [&](int x, int y, int c) { return (c == 3 ? alpha(x) : s(x, y, c)) * k; }),
                  W, H, rgb, fmt::format("RGBA {}", depth));
    expect_pixels(
        make_png(W, H, PNG_COLOR_TYPE_GRAY_ALPHA, depth,
                 [&](int x, int y, int c) { return (c == 1 ? alpha(x) : s(x, y, 0)) * k; }),
        W, H,
        [&](int x, int y) {
          return Rgb{s(x, y, 0), s(x, y, 0), s(x, y, 0)};
        },
        fmt::format("grey+alpha {}", depth));
  }
}

TEST(Png, PalettesAtEveryBitDepthExpandToTheirColours) {
  for (int depth : {1, 2, 4, 8}) {
    std::vector<Rgb> pal;
    for (int i = 0; i < std::min(1 << depth, 16); ++i) pal.push_back({i * 15, 255 - i * 13, (i * 97) % 256});
    auto idx = [&](int x, int y) { return (x + 2 * y) % static_cast<int>(pal.size()); };
    expect_pixels(
        make_png(
            W, H, PNG_COLOR_TYPE_PALETTE, depth, [&](int x, int y, int) { return idx(x, y); }, pal),
        W, H, [&](int x, int y) { return pal[static_cast<std::size_t>(idx(x, y))]; },
        fmt::format("palette {}-bit with tRNS", depth));
  }
}

TEST(Png, InterlacedFilesDecodeToTheSamePixels) {
  auto s = [](int x, int y, int c) { return (x * 13 + y * 29 + c * 91) % 256; };
  expect_pixels(
      make_png(19, 11, PNG_COLOR_TYPE_RGB, 8, s, {}, true), 19, 11,
      [&](int x, int y) {
        return Rgb{s(x, y, 0), s(x, y, 1), s(x, y, 2)};
      },
      "Adam7");
}

TEST(Png, DamagedAndTruncatedFilesDecodeOrSayWhyNeverCrash) {
  const auto good = make_png(24, 16, PNG_COLOR_TYPE_RGB, 8, [](int x, int y, int c) { return (x * y + c) % 256; });
  Image8 im;
  std::string why;
  ASSERT_TRUE(decode_image(good.data(), good.size(), im, why)) << why;
  int refused = 0;
  for (std::size_t n = 1; n < good.size(); ++n) {  // every truncation
    why.clear();
    if (!decode_image(good.data(), n, im, why)) {
      ++refused;
      EXPECT_FALSE(why.empty()) << n;
    }
  }
  EXPECT_GT(refused, static_cast<int>(good.size()) * 9 / 10);
  for (std::size_t i = 0; i < good.size(); ++i)  // a bit flipped in every byte
    for (int bit : {0, 7}) {
      auto bad = good;
      bad[i] ^= static_cast<unsigned char>(1 << bit);
      why.clear();
      if (!decode_image(bad.data(), bad.size(), im, why)) {
        EXPECT_FALSE(why.empty()) << i;
      }
    }
  // a flipped byte inside the image data fails its chunk's CRC: refused as corrupt
  auto crc = good;
  crc[good.size() - 20] ^= 0x55;
  EXPECT_FALSE(decode_image(crc.data(), crc.size(), im, why));
  EXPECT_NE(why.find("corrupt"), std::string::npos) << why;
  // a header that claims 60000 x 60000 pixels in a few hundred bytes
  auto huge = make_png(60000, 1, PNG_COLOR_TYPE_GRAY, 1, [](int, int, int) { return 0; });
  huge[16 + 4] = 0, huge[16 + 5] = 0, huge[16 + 6] = 0xea, huge[16 + 7] = 0x60;  // IHDR height = 60000
  EXPECT_FALSE(decode_image(huge.data(), huge.size(), im, why));
  EXPECT_FALSE(why.empty());
}

TEST(Png, FoldersMixJpegAndPngAndSkipDamagedPngs) {
  test::TempDir d("png");
  make_dataset((d.p / "a").string(), 6, 2, 40, 30, ImageFormat::png);
  make_dataset((d.p / "b").string(), 6, 2, 40, 30, ImageFormat::jpeg);
  for (const auto& e : fs::directory_iterator(d.p / "b" / "class_0000"))
    fs::copy_file(e.path(), d.p / "a" / "class_0000" / e.path().filename());
  const auto png = make_png(40, 30, PNG_COLOR_TYPE_RGB, 8, [](int x, int y, int c) { return x + y + c; });
  std::ofstream(d.p / "a" / "class_0001" / "zz_truncated.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size() / 2));
  const ImageFolder f = scan_image_folder((d.p / "a").string());
  EXPECT_EQ(f.png, 7u);
  EXPECT_EQ(f.jpeg, 3u);
  PipelineOptions o;
  o.batch = 4;
  o.image_size = 16;
  ImagePipeline p(f, o);
  for (int k = 0; k < 8; ++k) p.recycle(p.next());  // 32 images: three epochs of 10 files
  EXPECT_GE(p.skipped(), 1u);
  bool named = false;
  for (const auto& s : p.skipped_examples()) named |= s.find("zz_truncated.png") != std::string::npos;
  EXPECT_TRUE(named);
}

// The resize stage against the same triangle filter evaluated naively in double precision.
TEST(Png, ResizeToStoreMatchesANaiveReference) {
  for (auto [w, h, R] : {std::tuple{50, 37, 20}, {37, 50, 20}, {12, 9, 20}, {64, 64, 64}, {300, 41, 17}}) {
    Image8 in;
    in.w = w;
    in.h = h;
    in.px.resize(static_cast<std::size_t>(w) * h * 3);
    for (std::size_t i = 0; i < in.px.size(); ++i)
      in.px[i] = static_cast<unsigned char>(127 + 120 * std::sin(0.37 * static_cast<double>(i)));
    std::vector<unsigned char> out;
    resize_to_store(in, R, out);
    ASSERT_EQ(out.size(), static_cast<std::size_t>(R) * R * 3);
    const double s = static_cast<double>(R) / std::min(w, h);
    const int Wv = std::max(R, static_cast<int>(std::lround(w * s))),
              Hv = std::max(R, static_cast<int>(std::lround(h * s)));
    auto weights = [](int L, int Lv, int off, int i) {
      const double scale = static_cast<double>(L) / Lv, support = std::max(1.0, scale);
      const double c = (i + off + 0.5) * scale;
      std::vector<double> wt(static_cast<std::size_t>(L), 0.0);
      double sum = 0;
      for (int j = 0; j < L; ++j) {
        const double x = std::abs((j + 0.5 - c) / support);
        wt[static_cast<std::size_t>(j)] = x < 1 ? 1 - x : 0;
        sum += wt[static_cast<std::size_t>(j)];
      }
      for (auto& v : wt) v /= sum;
      return wt;
    };
    int worst = 0;
    for (int y = 0; y < R; ++y) {
      const auto wy = weights(h, Hv, (Hv - R) / 2, y);
      for (int x = 0; x < R; ++x) {
        const auto wx = weights(w, Wv, (Wv - R) / 2, x);
        for (int c = 0; c < 3; ++c) {
          double v = 0;
          for (int j = 0; j < h; ++j)
            for (int i = 0; i < w; ++i)
              v += wy[static_cast<std::size_t>(j)] * wx[static_cast<std::size_t>(i)] *
                   in.px[(static_cast<std::size_t>(j) * w + i) * 3 + c];
          const int want = static_cast<int>(std::clamp(std::floor(v + 0.5), 0.0, 255.0));
          worst = std::max(worst, std::abs(want - out[(static_cast<std::size_t>(y) * R + x) * 3 + c]));
        }
      }
    }
    EXPECT_LE(worst, 1) << w << "x" << h << " -> " << R;  // float sums against double: a rounding tie at most
  }
}

}  // namespace
}  // namespace stepbench
