#include "data/data.hpp"

#include <fmt/format.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include "tensor/error.hpp"

namespace stepbench {
namespace fs = std::filesystem;

namespace {

bool is_jpeg_name(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return e == ".jpg" || e == ".jpeg";
}

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double uniform(std::uint64_t& s) { return static_cast<double>(splitmix(s) >> 11) * 0x1.0p-53; }

struct TjHandle {
  tjhandle h;
  explicit TjHandle(bool compress) : h(compress ? tjInitCompress() : tjInitDecompress()) {
    if (!h) throw Error("libjpeg-turbo: could not create a handle");
  }
  ~TjHandle() { tjDestroy(h); }
};

}  // namespace

JpegFolder scan_jpeg_folder(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    throw UsageError(
        fmt::format("--data {}: no such folder; give a folder of class subfolders of JPEG files "
                    "(stepbench make-dataset {} writes a synthetic one)",
                    dir, dir));
  if (!fs::is_directory(dir, ec)) throw UsageError(fmt::format("--data {}: not a folder", dir));
  JpegFolder f;
  std::vector<fs::path> classes;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory()) classes.push_back(e.path());
  std::sort(classes.begin(), classes.end());
  for (const auto& c : classes) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(c, ec))
      if (e.is_regular_file() && is_jpeg_name(e.path())) files.push_back(e.path());
    if (files.empty()) continue;
    std::sort(files.begin(), files.end());
    const auto label = static_cast<std::int32_t>(f.classes.size());
    f.classes.push_back(c.filename().string());
    for (const auto& p : files) {
      f.files.push_back(p.string());
      f.labels.push_back(label);
    }
  }
  if (f.files.empty())
    throw UsageError(
        fmt::format("--data {}: no JPEG files found (expected {}/<class>/<image>.jpg); "
                    "stepbench make-dataset writes a synthetic one",
                    dir, dir));
  return f;
}

std::size_t make_jpeg_dataset(const std::string& dir, std::size_t images, int classes, int width, int height,
                              std::uint64_t seed) {
  if (images < 1 || classes < 1 || width < 8 || height < 8)
    throw UsageError("make-dataset: --images and --classes must be >= 1 and --size at least 8x8");
  TjHandle tj(true);
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
    unsigned char* jpeg = nullptr;
    unsigned long size = 0;
    if (tjCompress2(tj.h, rgb.data(), width, 0, height, TJPF_RGB, &jpeg, &size, TJSAMP_420, 90, TJFLAG_FASTDCT) != 0)
      throw Error(fmt::format("make-dataset: libjpeg-turbo: {}", tjGetErrorStr2(tj.h)));
    const auto path = fs::path(dir) / fmt::format("class_{:04d}", c) / fmt::format("img_{:07d}.jpg", i);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(jpeg), static_cast<std::streamsize>(size));
    tjFree(jpeg);
    if (!out) throw Error(fmt::format("make-dataset: could not write {}", path.string()));
  }
  return images;
}

bool decode_crop_normalise(const std::string& path, float* dst, const PipelineOptions& o, std::uint64_t rng_state,
                           std::string& why) {
  // The thread's decompressor. After a damaged file it is made anew: libjpeg-turbo 2.1 can leave a
  // handle that failed mid-header in a state in which the next, valid file fails too ("Bogus DQT
  // index"; tests/data/jpeg_mutation_test.cpp).
  thread_local std::unique_ptr<TjHandle> handle;
  thread_local std::vector<unsigned char> file, rgb;
  if (!handle) handle = std::make_unique<TjHandle>(false);
  const TjHandle& tj = *handle;
  struct Renew {  // on every return but the decoded one
    std::unique_ptr<TjHandle>& h;
    bool ok = false;
    ~Renew() {
      if (!ok) h.reset();
    }
  } renew{handle};
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    why = "cannot be opened";
    return false;
  }
  const auto size = static_cast<std::size_t>(in.tellg());
  if (size == 0) {
    why = "is empty";
    return false;
  }
  file.resize(size);
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(file.data()), static_cast<std::streamsize>(size))) {
    why = "cannot be read";
    return false;
  }
  int W = 0, H = 0, sub = 0, cs = 0;
  if (tjDecompressHeader3(tj.h, file.data(), size, &W, &H, &sub, &cs) != 0 || W <= 0 || H <= 0) {
    why = fmt::format("is not a JPEG ({})", tjGetErrorStr2(tj.h));
    return false;
  }
  // A damaged header may claim gigapixels in a few bytes: refuse what the file cannot hold (JPEG
  // compresses well, but not past ~2000:1 with room for a flat image) and anything past 2^28 pixels.
  const double pixels = static_cast<double>(W) * H;
  if (pixels > 268435456.0 || pixels * 3 > 2048.0 * static_cast<double>(size) + 67108864.0) {
    why = fmt::format(
        "claims {} x {} pixels in {} bytes (a damaged header, or an image far larger than training "
        "needs)",
        W, H, size);
    return false;
  }
  rgb.resize(static_cast<std::size_t>(W) * H * 3);
  if (tjDecompress2(tj.h, file.data(), size, rgb.data(), W, 0, H, TJPF_RGB, TJFLAG_FASTDCT) != 0 &&
      tjGetErrorCode(tj.h) == TJERR_FATAL) {
    why = fmt::format("is corrupt ({})", tjGetErrorStr2(tj.h));
    return false;
  }
  // RandomResizedCrop as torchvision: 10 tries at a random area and aspect ratio, else a centre crop.
  std::uint64_t s = rng_state;
  const double area = static_cast<double>(W) * H;
  int cw = W, ch = H, cx = 0, cy = 0;
  bool found = false;
  for (int t = 0; t < 10 && !found; ++t) {
    const double a = area * (o.scale_min + (o.scale_max - o.scale_min) * uniform(s));
    const double lr = std::log(o.ratio_min) + (std::log(o.ratio_max) - std::log(o.ratio_min)) * uniform(s);
    const double r = std::exp(lr);
    const int w = static_cast<int>(std::lround(std::sqrt(a * r))), h = static_cast<int>(std::lround(std::sqrt(a / r)));
    if (w > 0 && h > 0 && w <= W && h <= H) {
      cw = w;
      ch = h;
      cx = static_cast<int>(uniform(s) * (W - w + 1));
      cy = static_cast<int>(uniform(s) * (H - h + 1));
      found = true;
    }
  }
  if (!found) {  // centre crop clamped to the ratio range
    const double r = static_cast<double>(W) / H;
    if (r < o.ratio_min) {
      cw = W;
      ch = static_cast<int>(std::lround(W / o.ratio_min));
    } else if (r > o.ratio_max) {
      ch = H;
      cw = static_cast<int>(std::lround(H * o.ratio_max));
    }
    cx = (W - cw) / 2;
    cy = (H - ch) / 2;
  }
  const bool flip = uniform(s) < 0.5;
  const int S = static_cast<int>(o.image_size);
  const bool nhwc = o.layout == Layout::nhwc;
  const std::size_t plane = static_cast<std::size_t>(S) * S;
  float scale[3], shift[3];
  for (int k = 0; k < 3; ++k) {
    scale[k] = 1.0f / (255.0f * o.stddev[k]);
    shift[k] = -o.mean[k] / o.stddev[k];
  }
  // bilinear, sampling at pixel centres (align_corners = false)
  for (int y = 0; y < S; ++y) {
    const double sy = std::clamp((y + 0.5) * ch / S - 0.5, 0.0, ch - 1.0);
    const int y0 = static_cast<int>(sy), y1 = std::min(y0 + 1, ch - 1);
    const float wy = static_cast<float>(sy - y0);
    for (int x = 0; x < S; ++x) {
      const int xo = flip ? S - 1 - x : x;
      const double sx = std::clamp((x + 0.5) * cw / S - 0.5, 0.0, cw - 1.0);
      const int x0 = static_cast<int>(sx), x1 = std::min(x0 + 1, cw - 1);
      const float wx = static_cast<float>(sx - x0);
      const unsigned char* p00 = &rgb[((static_cast<std::size_t>(cy + y0)) * W + cx + x0) * 3];
      const unsigned char* p01 = &rgb[((static_cast<std::size_t>(cy + y0)) * W + cx + x1) * 3];
      const unsigned char* p10 = &rgb[((static_cast<std::size_t>(cy + y1)) * W + cx + x0) * 3];
      const unsigned char* p11 = &rgb[((static_cast<std::size_t>(cy + y1)) * W + cx + x1) * 3];
      for (int k = 0; k < 3; ++k) {
        const float top = p00[k] + wx * (p01[k] - p00[k]);
        const float bot = p10[k] + wx * (p11[k] - p10[k]);
        const float v = (top + wy * (bot - top)) * scale[k] + shift[k];
        if (nhwc)
          dst[(static_cast<std::size_t>(y) * S + xo) * 3 + k] = v;
        else
          dst[k * plane + static_cast<std::size_t>(y) * S + xo] = v;
      }
    }
  }
  renew.ok = true;
  return true;
}

// ---- the pipeline ---------------------------------------------------------------------------------
HostBatch::HostBatch(std::size_t image_floats, std::size_t batch, Backend* pin) {
  const std::size_t img_bytes = (image_floats * sizeof(float) + 63) / 64 * 64;  // labels 64-byte aligned
  const std::size_t bytes = img_bytes + batch * sizeof(std::int32_t);
  if (pin) {
    mem_ = {pin->allocate_host(bytes), [pin](void* p) { pin->deallocate_host(p); }};
    pinned_ = pin->is_pinned(mem_.get());
  } else {
    mem_ = {std::aligned_alloc(64, (bytes + 63) / 64 * 64), [](void* p) { std::free(p); }};
    if (!mem_) throw Error(fmt::format("out of host memory for a {:.1f} MiB input batch", bytes / 1048576.0));
  }
  auto* base = static_cast<char*>(mem_.get());
  images = {reinterpret_cast<float*>(base), image_floats};
  labels = {reinterpret_cast<std::int32_t*>(base + img_bytes), batch};
}

JpegPipeline::JpegPipeline(JpegFolder folder, PipelineOptions o) : folder_(std::move(folder)), o_(o) {
  if (o_.threads < 1) throw UsageError(fmt::format("--data-threads {} must be at least 1", o_.threads));
  if (o_.prefetch < 1) throw UsageError(fmt::format("--prefetch {} must be at least 1", o_.prefetch));
  order_.resize(folder_.files.size());
  for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  std::mt19937_64 rng(o_.seed);
  std::shuffle(order_.begin(), order_.end(), rng);
  const std::size_t image_floats = static_cast<std::size_t>(3 * o_.image_size * o_.image_size);
  // Batches in flight: every thread filling one, plus `prefetch` ready ones.
  for (int i = 0; i < o_.threads + o_.prefetch; ++i) {
    free_.push_back(std::make_unique<HostBatch>(image_floats * static_cast<std::size_t>(o_.batch),
                                                static_cast<std::size_t>(o_.batch), o_.pin));
  }
  for (int i = 0; i < o_.threads; ++i) threads_.emplace_back([this, i] { worker(i); });
}

JpegPipeline::~JpegPipeline() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  space_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void JpegPipeline::worker(int) {
  const std::size_t image_floats = static_cast<std::size_t>(3 * o_.image_size * o_.image_size);
  const std::size_t n = order_.size();
  for (;;) {
    std::unique_ptr<HostBatch> b;
    std::uint64_t ticket;
    {
      std::unique_lock<std::mutex> l(mu_);
      // Only `prefetch` batches may wait ready: the rest of the pool is for batches being filled.
      space_cv_.wait(
          l, [&] { return stop_ || (!free_.empty() && ready_.size() < static_cast<std::size_t>(o_.prefetch)); });
      if (stop_) return;
      b = std::move(free_.front());
      free_.pop_front();
      ticket = next_ticket_;
      next_ticket_ += static_cast<std::uint64_t>(o_.batch);
    }
    std::uint64_t probe = 0;  // extra files taken to replace skipped ones
    for (std::int64_t i = 0; i < o_.batch; ++i) {
      for (;;) {
        const std::uint64_t k = ticket + static_cast<std::uint64_t>(i) + probe * 7919u;
        const std::size_t file = order_[k % n];
        std::string why;
        if (decode_crop_normalise(folder_.files[file], b->images.data() + static_cast<std::size_t>(i) * image_floats,
                                  o_, o_.seed * 0x2545f4914f6cdd1dull + k, why)) {
          b->labels[static_cast<std::size_t>(i)] = folder_.labels[file];
          decoded_.fetch_add(1);
          failed_in_a_row_.store(0);
          break;
        }
        ++probe;
        skipped_.fetch_add(1);
        std::lock_guard<std::mutex> l(mu_);
        if (skipped_examples_.size() < 5) skipped_examples_.push_back(fmt::format("{} {}", folder_.files[file], why));
        if (failed_in_a_row_.fetch_add(1) + 1 > n + 8) {  // every file failed
          fatal_ = fmt::format("no file of the data folder could be decoded, e.g. {} {}", folder_.files[file], why);
          stop_ = true;
          ready_cv_.notify_all();
          space_cv_.notify_all();
          return;
        }
        if (stop_) return;
      }
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      ready_.push_back(std::move(b));
    }
    ready_cv_.notify_one();
  }
}

std::unique_ptr<HostBatch> JpegPipeline::next() {
  std::unique_lock<std::mutex> l(mu_);
  ready_cv_.wait(l, [&] { return !ready_.empty() || !fatal_.empty() || stop_; });
  if (ready_.empty()) throw Error(fatal_.empty() ? "the input pipeline stopped" : fatal_);
  auto b = std::move(ready_.front());
  ready_.pop_front();
  l.unlock();
  space_cv_.notify_all();
  return b;
}

void JpegPipeline::recycle(std::unique_ptr<HostBatch> b) {
  {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(std::move(b));
  }
  space_cv_.notify_all();
}

std::vector<std::string> JpegPipeline::skipped_examples() const {
  std::lock_guard<std::mutex> l(mu_);
  return skipped_examples_;
}

}  // namespace stepbench
