// Input pipelines. An image folder in ImageNet's layout (one subfolder per class; JPEG and PNG
// files, mixed) or a record file of pre-resized images (make-records), decoded on a pool of
// threads, random-resized-cropped and flipped, normalised to float in the model's layout,
// assembled in pinned host batches and prefetched. Each stage of each image is timed (thread
// time), so a run can say which stage makes the step input-bound. --cache memory decodes and
// resizes every file once, at start, and then runs only the crop, flip and normalisation per step.
#pragma once
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.hpp"
#include "data/augment.hpp"
#include "data/decode.hpp"
#include "data/records.hpp"
#include "data/stages.hpp"

namespace stepbench {

// The files of an ImageNet-style folder: DIR/<class>/<image>.{jpg,jpeg,png}, classes in sorted order.
struct ImageFolder {
  std::vector<std::string> files;
  std::vector<std::int32_t> labels;
  std::vector<std::string> classes;
  std::size_t jpeg = 0, png = 0;  // files of each kind, by name
};
// Throws UsageError when the folder is missing, is not a folder, or holds no JPEG or PNG files.
ImageFolder scan_image_folder(const std::string& dir);

// Writes a synthetic data set: `images` files of width x height spread over `classes` subfolders,
// with smooth random content (so they compress like photographs, not like noise), as JPEG
// (quality 90, 4:2:0) or PNG (8-bit RGB, zlib's default level). Returns the number written.
std::size_t make_dataset(const std::string& dir, std::size_t images, int classes, int width, int height,
                         ImageFormat format = ImageFormat::jpeg, std::uint64_t seed = 1);

enum class InputCache { none, memory };

struct PipelineOptions {
  std::int64_t batch = 1;
  std::int64_t image_size = 299;
  int store_size = 0;  // the resize stage's R x R (0: default_store_size(image_size)); records bring their own
  Layout layout = Layout::nchw;
  int threads = 2;   // decoding threads
  int prefetch = 2;  // batches decoded ahead
  std::uint64_t seed = 1;
  InputCache cache = InputCache::none;
  // --cache memory may use at most this many bytes; 0: 80% of the memory the kernel reports available
  std::uint64_t cache_limit_bytes = 0;
  // torchvision's RandomResizedCrop defaults and ImageNet's normalisation
  float scale_min = 0.08f, scale_max = 1.0f;
  float ratio_min = 3.0f / 4.0f, ratio_max = 4.0f / 3.0f;
  float mean[3] = {0.485f, 0.456f, 0.406f};
  float stddev[3] = {0.229f, 0.224f, 0.225f};
  // The backend whose allocate_host provides the batches (pinned on the cuda backend, so staging
  // copies are asynchronous DMA); null: plain host memory. It must outlive the pipeline.
  Backend* pin = nullptr;
  // --decode gpu: the threads only read the files (a folder of JPEG files, no cache); each batch
  // carries the files' bytes and their crops (HostBatch::files, crops) for the device to decode.
  bool encoded = false;
};

// What the kernel says can be allocated without swapping (MemAvailable), in bytes; 0 if unknown.
std::uint64_t available_memory_bytes();
// The most --cache memory may use: o.cache_limit_bytes, or 80% of the available memory.
std::uint64_t cache_limit_bytes(const PipelineOptions& o);

// A batch on the host: images as float32 in the pipeline's layout, and int32 labels, in one
// allocation from pin->allocate_host, or plain memory without a backend.
class HostBatch {
 public:
  HostBatch(std::size_t image_floats, std::size_t batch, Backend* pin = nullptr);
  std::span<float> images;  // empty for an encoded pipeline's batches
  std::span<std::int32_t> labels;
  // An encoded pipeline's batch (PipelineOptions::encoded): each image's JPEG file, its crop in the
  // R x R image and flip, and its item (ImagePipeline::file_name).
  std::vector<std::vector<unsigned char>> files;
  std::vector<ImageCrop> crops;
  std::vector<std::size_t> items;
  bool pinned() const { return pinned_; }

 private:
  std::unique_ptr<void, std::function<void(void*)>> mem_;
  bool pinned_ = false;
};

// Decodes batches on background threads. Images are visited in a seeded random order, epoch after
// epoch; image k of that order gets crop and flip seed f(seed, k) whatever the source, so a folder,
// the same folder cached and its record file give the same batches bit for bit. A file that cannot
// be read or decoded is skipped and counted; if every file fails, next() throws.
class ImagePipeline {
 public:
  ImagePipeline(ImageFolder folder, PipelineOptions o);  // o.cache: memory fills the cache here
  ImagePipeline(std::shared_ptr<const RecordFile> records, PipelineOptions o);
  ~ImagePipeline();
  ImagePipeline(const ImagePipeline&) = delete;
  ImagePipeline& operator=(const ImagePipeline&) = delete;

  // The next decoded batch (blocks until one is ready). The caller hands it back with recycle().
  std::unique_ptr<HostBatch> next();
  void recycle(std::unique_ptr<HostBatch> b);

  std::size_t skipped() const { return skipped_.load(); }
  std::vector<std::string> skipped_examples() const;  // a few of the skipped files, with the reason
  std::size_t decoded() const { return decoded_.load(); }
  const PipelineOptions& options() const { return o_; }
  std::size_t num_classes() const { return classes_; }
  std::size_t num_images() const { return labels_.size(); }
  int store_size() const { return R_; }
  // Thread time per stage since the start, summed over the threads (the cache's fill excluded).
  StageTimes stage_times() const;
  // The fill of --cache memory: its stage times, wall seconds and bytes (zeros without a cache).
  const StageTimes& cache_fill() const { return fill_; }
  double cache_fill_seconds() const { return fill_seconds_; }
  std::uint64_t cache_bytes() const { return cache_.size(); }
  const std::string& file_name(std::size_t item) const { return files_.at(item); }
  // --trace: every worker's stages as spans from now on (or no more); take_stage_spans hands over
  // each worker's since the last take, [thread][span].
  void trace_stages(bool on);
  std::vector<std::vector<StageSpan>> take_stage_spans();
  // An image the consumer could not decode after all (--decode gpu): counted and named as skipped.
  void count_skipped(std::size_t item, const std::string& why);

 private:
  void start();
  void validate() const;  // threads and prefetch, before anything runs
  void stop_threads();
  void fill_cache(const std::vector<std::string>& files);
  void worker(int id);
  // The R x R image of item i into *img (pointing at the cache, the records or buf), timing its stages.
  bool load(std::size_t i, std::vector<unsigned char>& buf, const unsigned char** img, StageCounters& clk,
            std::string& why);

  PipelineOptions o_;
  std::vector<std::string> files_;  // folder source
  std::shared_ptr<const RecordFile> records_;
  std::vector<std::int32_t> labels_;
  std::size_t classes_ = 0;
  int R_ = 0;
  std::vector<unsigned char> cache_;    // --cache memory: every image, R x R x 3
  std::vector<std::string> cache_why_;  // per image: "" cached, else why it was not
  StageTimes fill_;
  double fill_seconds_ = 0;
  std::vector<std::unique_ptr<StageCounters>> counters_;  // one per thread
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::condition_variable ready_cv_, space_cv_;
  std::deque<std::unique_ptr<HostBatch>> ready_, free_;
  std::uint64_t next_ticket_ = 0;  // image cursor handed to workers
  std::vector<std::size_t> order_;
  std::uint64_t probe_stride_ = 1;  // replacements for a skipped image: a stride coprime with the count
  bool stop_ = false;
  std::atomic<std::size_t> skipped_{0}, decoded_{0}, failed_in_a_row_{0};
  std::vector<std::string> skipped_examples_;
  std::string fatal_;
};

}  // namespace stepbench
