#include <fmt/format.h>

#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>

#include "data/data.hpp"
#include "tensor/error.hpp"

namespace stepbench {

namespace {

std::uint64_t crop_seed(std::uint64_t seed, std::uint64_t k) { return seed * 0x2545f4914f6cdd1dull + k; }

}  // namespace

std::uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::uint64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);  // a kernel without MemAvailable
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

std::uint64_t cache_limit_bytes(const PipelineOptions& o) {
  return o.cache_limit_bytes ? o.cache_limit_bytes : available_memory_bytes() / 10 * 8;
}

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

ImagePipeline::ImagePipeline(ImageFolder folder, PipelineOptions o) : o_(o) {
  validate();
  if (o_.encoded && folder.png > 0)
    throw UsageError(fmt::format(
        "--decode gpu decodes JPEG files (nvJPEG); the folder holds {} PNG file{}: drop --decode gpu, or make a "
        "record file of it (stepbench make-records) and use --data with that",
        folder.png, folder.png == 1 ? "" : "s"));
  if (o_.encoded && o_.cache == InputCache::memory)
    throw UsageError("--decode gpu decodes every step on the GPU; --cache memory decodes once on the CPU: give one");
  R_ = o_.store_size > 0 ? o_.store_size : default_store_size(o_.image_size);
  files_ = std::move(folder.files);
  labels_ = std::move(folder.labels);
  classes_ = folder.classes.size();
  if (o_.cache == InputCache::memory) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(files_.size()) * R_ * R_ * 3;
    const std::uint64_t limit = cache_limit_bytes(o_);
    if (bytes > limit)
      throw UsageError(fmt::format(
          "--cache memory needs {:.1f} MiB ({} images of {}x{}x3 bytes), more than the {:.1f} MiB it may use ({}); "
          "use stepbench make-records DIR OUT.records and --data OUT.records (read from disk, memory-mapped), "
          "or a smaller --image-size",
          bytes / 1048576.0, files_.size(), R_, R_, limit / 1048576.0,
          o_.cache_limit_bytes ? "--cache-limit-mb" : "80% of the memory available"));
    fill_cache(files_);
  }
  start();
}

ImagePipeline::ImagePipeline(std::shared_ptr<const RecordFile> records, PipelineOptions o)
    : o_(o), records_(std::move(records)) {
  validate();
  if (o_.cache == InputCache::memory)
    throw UsageError("--cache memory with a record file: the records are already decoded and resized; drop --cache");
  if (o_.encoded)
    throw UsageError("--decode gpu with a record file: the records are already decoded and resized; drop --decode");
  R_ = records_->store_size();
  classes_ = records_->classes().size();
  labels_.resize(records_->size());
  for (std::size_t i = 0; i < labels_.size(); ++i) labels_[i] = records_->label(i);
  start();
}

void ImagePipeline::validate() const {
  if (o_.threads < 1) throw UsageError(fmt::format("--data-threads {} must be at least 1", o_.threads));
  if (o_.prefetch < 1) throw UsageError(fmt::format("--prefetch {} must be at least 1", o_.prefetch));
}

void ImagePipeline::fill_cache(const std::vector<std::string>& files) {
  const std::size_t img = static_cast<std::size_t>(R_) * R_ * 3;
  cache_.resize(files.size() * img);
  cache_why_.assign(files.size(), "");
  std::atomic<std::size_t> next{0};
  std::vector<std::unique_ptr<StageCounters>> counters;
  counters.reserve(static_cast<std::size_t>(o_.threads));
  for (int t = 0; t < o_.threads; ++t) counters.push_back(std::make_unique<StageCounters>());
  const auto t0 = std::chrono::steady_clock::now();
  auto work = [&](int t) {
    std::vector<unsigned char> file, stored;
    Image8 im;
    StageCounters& clk = *counters[static_cast<std::size_t>(t)];
    for (std::size_t i; (i = next.fetch_add(1)) < files.size();) {
      std::string& why = cache_why_[i];
      try {  // an allocation that fails for one image skips that image
        if (!read_file(files[i], file, why)) continue;
        clk.lap(Stage::read);
        if (!decode_image(file.data(), file.size(), im, why)) continue;
        clk.lap(Stage::decode);
        resize_to_store(im, R_, stored);
        std::copy(stored.begin(), stored.end(), cache_.begin() + static_cast<std::ptrdiff_t>(i * img));
        clk.lap(Stage::resize);
        clk.count_image();
      } catch (const std::exception& e) {
        why = fmt::format("could not be decoded ({})", e.what());
      }
    }
  };
  {
    std::vector<std::jthread> pool;  // joined on every way out, an exception included
    for (int t = 1; t < o_.threads; ++t) pool.emplace_back(work, t);
    work(0);
  }
  fill_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& c : counters) c->add_to(fill_);
  fill_.open = 0;  // the clocks ran on to the join: the fill's wall time is fill_seconds_
}

void ImagePipeline::start() {
  order_.resize(labels_.size());
  for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  std::mt19937_64 rng(o_.seed);
  std::shuffle(order_.begin(), order_.end(), rng);
  // A skipped image is replaced by the one `probe_stride_` further on in the order: a prime that
  // does not divide the count, so that the replacements reach every image.
  for (std::uint64_t p : {7919u, 7907u, 7901u, 7883u, 1u})
    if (p == 1 || order_.size() % p != 0) {
      probe_stride_ = p;
      break;
    }
  const std::size_t image_floats = o_.encoded ? 0 : static_cast<std::size_t>(3 * o_.image_size * o_.image_size);
  // Batches in flight: every thread filling one, plus `prefetch` ready ones.
  for (int i = 0; i < o_.threads + o_.prefetch; ++i) {
    free_.push_back(std::make_unique<HostBatch>(image_floats * static_cast<std::size_t>(o_.batch),
                                                static_cast<std::size_t>(o_.batch), o_.pin));
    if (o_.encoded) {
      free_.back()->files.resize(static_cast<std::size_t>(o_.batch));
      free_.back()->crops.resize(static_cast<std::size_t>(o_.batch));
      free_.back()->items.resize(static_cast<std::size_t>(o_.batch));
    }
  }
  counters_.reserve(static_cast<std::size_t>(o_.threads));
  for (int i = 0; i < o_.threads; ++i) counters_.push_back(std::make_unique<StageCounters>());
  try {
    for (int i = 0; i < o_.threads; ++i) threads_.emplace_back([this, i] { worker(i); });
  } catch (...) {  // a thread that could not start: stop and join the others before the error goes on
    stop_threads();
    throw;
  }
}

void ImagePipeline::stop_threads() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  space_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

ImagePipeline::~ImagePipeline() { stop_threads(); }

bool ImagePipeline::load(std::size_t i, std::vector<unsigned char>& buf, const unsigned char** img, StageCounters& clk,
                         std::string& why) {
  if (records_) {  // a copy out of the mapping: the page faults are the read
    const unsigned char* p = records_->image(i);
    buf.assign(p, p + records_->image_bytes());
    clk.lap(Stage::read);
    *img = buf.data();
    return true;
  }
  if (!cache_.empty()) {
    if (!cache_why_[i].empty()) {
      why = cache_why_[i];
      return false;
    }
    *img = cache_.data() + i * static_cast<std::size_t>(R_) * R_ * 3;
    return true;
  }
  thread_local std::vector<unsigned char> file;
  thread_local Image8 im;
  const bool read = read_file(files_[i], file, why);
  clk.lap(Stage::read);
  if (!read) return false;
  const bool decoded = decode_image(file.data(), file.size(), im, why);
  clk.lap(Stage::decode);
  if (!decoded) return false;
  resize_to_store(im, R_, buf);
  clk.lap(Stage::resize);
  *img = buf.data();
  return true;
}

void ImagePipeline::worker(int id) {
  const std::size_t image_floats = static_cast<std::size_t>(3 * o_.image_size * o_.image_size);
  const std::size_t n = order_.size();
  const int S = static_cast<int>(o_.image_size);
  StageCounters& ctr = *counters_[static_cast<std::size_t>(id)];
  std::vector<unsigned char> buf;
  std::vector<float> crop(static_cast<std::size_t>(S) * S * 3);
  for (;;) {
    std::unique_ptr<HostBatch> b;
    std::uint64_t ticket;
    {
      std::unique_lock<std::mutex> l(mu_);
      // Only `prefetch` batches may wait ready: the rest of the pool is for batches being filled.
      ctr.begin_idle();
      space_cv_.wait(
          l, [&] { return stop_ || (!free_.empty() && ready_.size() < static_cast<std::size_t>(o_.prefetch)); });
      ctr.end_idle();
      if (stop_) return;
      b = std::move(free_.front());
      free_.pop_front();
      ticket = next_ticket_;
      next_ticket_ += static_cast<std::uint64_t>(o_.batch);
    }
    std::uint64_t probe = 0;  // extra images taken to replace skipped ones
    for (std::int64_t i = 0; i < o_.batch; ++i) {
      for (;;) {
        const std::uint64_t k = ticket + static_cast<std::uint64_t>(i) + probe * probe_stride_;
        const std::size_t item = order_[k % n];
        std::string why;
        const unsigned char* img = nullptr;
        ctr.lap(Stage::assembly);
        bool ok = false;
        try {                // an allocation that fails for one image skips that image
          if (o_.encoded) {  // the file's bytes for the device, its header checked here
            auto& f = b->files[static_cast<std::size_t>(i)];
            ok = read_file(files_[item], f, why) && jpeg_header(f.data(), f.size(), why);
            ctr.lap(Stage::read);
          } else {
            ok = load(item, buf, &img, ctr, why);
          }
        } catch (const std::exception& e) {
          why = fmt::format("could not be decoded ({})", e.what());
        }
        if (ok && o_.encoded) {
          const CropBox box = random_crop_box(R_, o_, crop_seed(o_.seed, k));
          b->crops[static_cast<std::size_t>(i)] = ImageCrop{box.x, box.y, box.w, box.h, box.flip};
          b->items[static_cast<std::size_t>(i)] = item;
          b->labels[static_cast<std::size_t>(i)] = labels_[item];
          ctr.lap(Stage::assembly);
          decoded_.fetch_add(1);
          ctr.count_image();
          failed_in_a_row_.store(0);
          break;
        }
        if (ok) {
          const CropBox box = random_crop_box(R_, o_, crop_seed(o_.seed, k));
          crop_resize(img, R_, box, S, crop.data());
          ctr.lap(Stage::crop);
          flip_normalise(crop.data(), S, box.flip, o_.layout, o_,
                         b->images.data() + static_cast<std::size_t>(i) * image_floats);
          ctr.lap(Stage::flip_normalise);
          b->labels[static_cast<std::size_t>(i)] = labels_[item];
          decoded_.fetch_add(1);
          ctr.count_image();
          failed_in_a_row_.store(0);
          break;
        }
        ++probe;
        skipped_.fetch_add(1);
        const std::string& name = records_ ? records_->path() : files_[item];
        std::lock_guard<std::mutex> l(mu_);
        if (skipped_examples_.size() < 5) skipped_examples_.push_back(fmt::format("{} {}", name, why));
        if (failed_in_a_row_.fetch_add(1) + 1 > n + 8) {  // every file failed
          fatal_ = fmt::format("no file of the data folder could be decoded, e.g. {} {}", name, why);
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
    ctr.lap(Stage::assembly);
    ctr.count_batch();
  }
}

std::unique_ptr<HostBatch> ImagePipeline::next() {
  std::unique_lock<std::mutex> l(mu_);
  ready_cv_.wait(l, [&] { return !ready_.empty() || !fatal_.empty() || stop_; });
  if (ready_.empty()) throw Error(fatal_.empty() ? "the input pipeline stopped" : fatal_);
  auto b = std::move(ready_.front());
  ready_.pop_front();
  l.unlock();
  space_cv_.notify_all();
  return b;
}

void ImagePipeline::recycle(std::unique_ptr<HostBatch> b) {
  {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(std::move(b));
  }
  space_cv_.notify_all();
}

void ImagePipeline::count_skipped(std::size_t item, const std::string& why) {
  skipped_.fetch_add(1);
  std::lock_guard<std::mutex> l(mu_);
  if (skipped_examples_.size() < 5) skipped_examples_.push_back(fmt::format("{} {}", files_.at(item), why));
}

std::vector<std::string> ImagePipeline::skipped_examples() const {
  std::lock_guard<std::mutex> l(mu_);
  return skipped_examples_;
}

void ImagePipeline::trace_stages(bool on) {
  for (auto& c : counters_) c->trace(on);
}

std::vector<std::vector<StageSpan>> ImagePipeline::take_stage_spans() {
  std::vector<std::vector<StageSpan>> v;
  for (auto& c : counters_) v.push_back(c->take_spans());
  return v;
}

StageTimes ImagePipeline::stage_times() const {
  StageTimes t;
  for (const auto& c : counters_) c->add_to(t);
  return t;
}

}  // namespace stepbench
