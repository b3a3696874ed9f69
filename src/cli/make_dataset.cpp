// stepbench make-dataset DIR: a synthetic JPEG folder in ImageNet's layout, to try --data DIR
// without downloading a data set.
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
      "stepbench make-dataset: write a synthetic JPEG folder in ImageNet's layout (DIR/<class>/<image>.jpg), "
      "to try --data DIR without downloading a data set",
      "stepbench make-dataset"};
  std::string dir, size = "500x375";
  std::size_t images = 1000;
  int classes = 10;
  std::uint64_t seed = 1;
  app.add_option("dir", dir, "the folder to write")->required();
  app.add_option("--images", images, "how many images")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000000}));
  app.add_option("--classes", classes, "class subfolders")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--size", size, "WxH of every image")->capture_default_str();
  app.add_option("--seed", seed, "content seed")->capture_default_str();
  if (auto rc = parse_args(app, argc, argv, 2, "stepbench make-dataset")) return *rc;
  int w = 0, h = 0;
  char x = 0;
  std::istringstream in(size);
  if (!(in >> w >> x >> h) || (x != 'x' && x != 'X') || w < 8 || h < 8 || w > 65535 || h > 65535)
    throw UsageError(fmt::format("--size '{}' must be WxH, e.g. 500x375 (each side 8 to 65535)", size));
  const auto t0 = std::chrono::steady_clock::now();
  make_jpeg_dataset(dir, images, classes, w, h, seed);
  fmt::print("stepbench make-dataset: wrote {} JPEGs of {}x{} in {} classes to {} ({:.1f} s)\n", images, w, h, classes,
             dir, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace stepbench::cli
