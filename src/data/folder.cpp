// The image folder: its scan, and the synthetic data sets of make-dataset.
#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/data.hpp"
#include "data/random.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace fs = std::filesystem;

ImageFolder scan_image_folder(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    throw UsageError(
        fmt::format("--data {}: no such folder; give a folder of class subfolders of JPEG or PNG files "
                    "(stepbench make-dataset {} writes a synthetic one), or a record file of make-records",
                    dir, dir));
  if (!fs::is_directory(dir, ec)) throw UsageError(fmt::format("--data {}: not a folder", dir));
  ImageFolder f;
  std::vector<fs::path> classes;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory()) classes.push_back(e.path());
  std::sort(classes.begin(), classes.end());
  for (const auto& c : classes) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(c, ec))
      if (e.is_regular_file() && image_format_of_name(e.path().string()) != ImageFormat::unknown)
        files.push_back(e.path());
    if (files.empty()) continue;
    std::sort(files.begin(), files.end());
    const auto label = static_cast<std::int32_t>(f.classes.size());
    f.classes.push_back(c.filename().string());
    for (const auto& p : files) {
      f.files.push_back(p.string());
      f.labels.push_back(label);
      ++(image_format_of_name(p.string()) == ImageFormat::png ? f.png : f.jpeg);
    }
  }
  if (f.files.empty())
    throw UsageError(
        fmt::format("--data {}: no JPEG or PNG files found (expected {}/<class>/<image>.jpg or .png); "
                    "stepbench make-dataset writes a synthetic one",
                    dir, dir));
  return f;
}

std::size_t make_dataset(const std::string& dir, std::size_t images, int classes, int width, int height,
                         ImageFormat format, std::uint64_t seed) {
  if (images < 1 || classes < 1 || width < 8 || height < 8)
    throw UsageError("make-dataset: --images and --classes must be >= 1 and --size at least 8x8");
  if (format == ImageFormat::unknown) throw UsageError("make-dataset: --format must be jpeg or png");
  tjhandle tj = format == ImageFormat::jpeg ? tjInitCompress() : nullptr;
  if (format == ImageFormat::jpeg && !tj) throw Error("libjpeg-turbo: could not create a handle");
  struct Done {
    tjhandle h;
    ~Done() {
      if (h) tjDestroy(h);
    }
  } done{tj};
  std::vector<unsigned char> rgb(static_cast<std::size_t>(width) * height * 3);
  std::uint64_t s = seed;
  for (int c = 0; c < classes; ++c) fs::create_directories(fs::path(dir) / fmt::format("class_{:04d}", c));
  for (std::size_t i = 0; i < images; ++i) {
    const int c = static_cast<int>(i % static_cast<std::size_t>(classes));
    // a few random plane waves per channel and a class tint: smooth like a photograph
    double fx[3][3], fy[3][3], ph[3][3];
    for (auto* a : {fx, fy, ph})
      for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 3; ++j) a[k][j] = uniform(s) * (a == ph ? 6.283 : 0.08);
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x)
        for (int k = 0; k < 3; ++k) {
          double v = 90.0 + 40.0 * ((c * 37 + k * 11) % 5);
          for (int j = 0; j < 3; ++j) v += 30.0 * std::sin(fx[k][j] * x + fy[k][j] * y + ph[k][j]);
          v += 8.0 * (uniform(s) - 0.5);
          rgb[(static_cast<std::size_t>(y) * width + x) * 3 + k] =
              static_cast<unsigned char>(std::clamp(v, 0.0, 255.0));
        }
    const auto stem = fs::path(dir) / fmt::format("class_{:04d}", c) / fmt::format("img_{:07d}", i);
    if (format == ImageFormat::png) {
      png_image im{};
      im.version = PNG_IMAGE_VERSION;
      im.width = static_cast<png_uint_32>(width);
      im.height = static_cast<png_uint_32>(height);
      im.format = PNG_FORMAT_RGB;
      const auto path = stem.string() + ".png";
      if (!png_image_write_to_file(&im, path.c_str(), 0, rgb.data(), 0, nullptr))
        throw Error(fmt::format("make-dataset: could not write {}: {}", path, im.message));
      continue;
    }
    unsigned char* jpeg = nullptr;
    unsigned long size = 0;
    if (tjCompress2(tj, rgb.data(), width, 0, height, TJPF_RGB, &jpeg, &size, TJSAMP_420, 90, TJFLAG_FASTDCT) != 0)
      throw Error(fmt::format("make-dataset: libjpeg-turbo: {}", tjGetErrorStr2(tj)));
    const auto path = stem.string() + ".jpg";
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(jpeg), static_cast<std::streamsize>(size));
    tjFree(jpeg);
    if (!out) throw Error(fmt::format("make-dataset: could not write {}", path));
  }
  return images;
}

}  // namespace stepbench
