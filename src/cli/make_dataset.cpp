// stepbench make-dataset DIR: a synthetic JPEG or PNG folder in ImageNet's layout, to try --data DIR
// without downloading a data set; stepbench make-records DIR OUT: the folder pre-resized into a
// record file for --data OUT.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <sstream>

#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "data/data.hpp"
#include "tensor/error.hpp"

namespace stepbench::cli {

int make_dataset_main(int argc, char** argv) {
  CLI::App app{
      "stepbench make-dataset: write a synthetic JPEG or PNG folder in ImageNet's layout "
      "(DIR/<class>/<image>.jpg or .png), to try --data DIR without downloading a data set",
      "stepbench make-dataset"};
  std::string dir, size = "500x375", format = "jpeg";
  std::size_t images = 1000;
  int classes = 10;
  std::uint64_t seed = 1;
  app.add_option("dir", dir, "the folder to write")->required();
  app.add_option("--images", images, "how many images")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000000}));
  app.add_option("--classes", classes, "class subfolders")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--size", size, "WxH of every image")->capture_default_str();
  app.add_option("--format", format, "jpeg (quality 90, 4:2:0) or png (8-bit RGB)")
      ->capture_default_str()
      ->check(CLI::IsMember({"jpeg", "png"}));
  app.add_option("--seed", seed, "content seed")->capture_default_str();
  if (auto rc = parse_args(app, argc, argv, 2, "stepbench make-dataset")) return *rc;
  int w = 0, h = 0;
  char x = 0;
  std::istringstream in(size);
  if (!(in >> w >> x >> h) || (x != 'x' && x != 'X') || w < 8 || h < 8 || w > 65535 || h > 65535)
    throw UsageError(fmt::format("--size '{}' must be WxH, e.g. 500x375 (each side 8 to 65535)", size));
  const auto t0 = std::chrono::steady_clock::now();
  make_dataset(dir, images, classes, w, h, format == "png" ? ImageFormat::png : ImageFormat::jpeg, seed);
  fmt::print("stepbench make-dataset: wrote {} {}s of {}x{} in {} classes to {} ({:.1f} s)\n", images,
             format == "png" ? "PNG" : "JPEG", w, h, classes, dir,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

int make_records_main(int argc, char** argv) {
  CLI::App app{
      "stepbench make-records: decode and resize every image of a folder once (the input pipeline's read, "
      "decode and resize stages) and write them, raw, with their labels, to one record file for --data OUT",
      "stepbench make-records"};
  std::string dir, out;
  std::int64_t image_size = 299;
  int store = 0, threads = 2;
  app.add_option("dir", dir, "the image folder (DIR/<class>/<image>.jpg or .png)")->required();
  app.add_option("out", out, "the record file to write")->required();
  app.add_option("--image-size", image_size, "the crop size the records are for; they store 8/7 of it")
      ->capture_default_str()
      ->check(CLI::Range(8, 4096));
  app.add_option("--store-size", store, "the stored R x R instead (8 to 4096)")->check(CLI::Range(8, 4096));
  app.add_option("--threads", threads, "decoding threads")->capture_default_str()->check(CLI::Range(1, 1024));
  if (auto rc = parse_args(app, argc, argv, 2, "stepbench make-records")) return *rc;
  if (app.count("--image-size") && app.count("--store-size"))
    throw UsageError("make-records: give --image-size (the records store 8/7 of it) or --store-size, not both");
  const int R = store > 0 ? store : default_store_size(image_size);
  const ImageFolder f = scan_image_folder(dir);
  const auto t0 = std::chrono::steady_clock::now();
  const RecordsWritten w = write_records(f, out, R, threads);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(
      "stepbench make-records: wrote {} images of {}x{} ({} classes, {:.1f} MiB) to {} in {:.1f} s ({:.0f} images/s)\n",
      w.images, R, R, f.classes.size(), static_cast<double>(w.bytes) / 1048576.0, out, s, w.images / s);
  if (w.skipped > 0) {
    fmt::print("{} unreadable or corrupt file{} left out, e.g.:\n", w.skipped, w.skipped == 1 ? "" : "s");
    for (const auto& e : w.skipped_examples) fmt::print("  {}\n", e);
  }
  return 0;
}

}  // namespace stepbench::cli
