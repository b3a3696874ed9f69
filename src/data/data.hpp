// Input pipelines. A JPEG folder in ImageNet's layout (one subfolder per class) decoded by
// libjpeg-turbo on a pool of threads, random-resized-cropped and flipped, normalised to float in
// the model's layout, assembled in pinned host batches and prefetched; and the staging of host
// batches to the device on a copy stream, double-buffered so the copy for step k+1 overlaps the
// compute of step k.
#pragma once
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

namespace stepbench {

// The files of an ImageNet-style folder: DIR/<class>/<image>.jp(e)g, classes in sorted order.
struct JpegFolder {
  std::vector<std::string> files;
  std::vector<std::int32_t> labels;
  std::vector<std::string> classes;
};
// Throws UsageError when the folder is missing, is not a folder, or holds no JPEG files.
JpegFolder scan_jpeg_folder(const std::string& dir);

// Writes a synthetic data set: `images` JPEGs of width x height spread over `classes` subfolders,
// with smooth random content (so they compress like photographs, not like noise). Returns the
// number written.
std::size_t make_jpeg_dataset(const std::string& dir, std::size_t images, int classes, int width, int height,
                              std::uint64_t seed = 1);

struct PipelineOptions {
  std::int64_t batch = 1;
  std::int64_t image_size = 299;
  Layout layout = Layout::nchw;
  int threads = 2;   // decoding threads
  int prefetch = 2;  // batches decoded ahead
  std::uint64_t seed = 1;
  // torchvision's RandomResizedCrop defaults and ImageNet's normalisation
  float scale_min = 0.08f, scale_max = 1.0f;
  float ratio_min = 3.0f / 4.0f, ratio_max = 4.0f / 3.0f;
  float mean[3] = {0.485f, 0.456f, 0.406f};
  float stddev[3] = {0.229f, 0.224f, 0.225f};
  // The backend whose allocate_host provides the batches (pinned on the cuda backend, so staging
  // copies are asynchronous DMA); null: plain host memory. It must outlive the pipeline.
  Backend* pin = nullptr;
};

// A batch on the host: images as float32 in the pipeline's layout, and int32 labels, in one
// allocation from pin->allocate_host, or plain memory without a backend.
class HostBatch {
 public:
  HostBatch(std::size_t image_floats, std::size_t batch, Backend* pin = nullptr);
  std::span<float> images;
  std::span<std::int32_t> labels;
  bool pinned() const { return pinned_; }

 private:
  std::unique_ptr<void, std::function<void(void*)>> mem_;
  bool pinned_ = false;
};

// Decodes batches of a JpegFolder on background threads. Files are visited in a seeded random
// order, epoch after epoch. A file that cannot be read or decoded is skipped and counted; if every
// file of the folder fails, next() throws.
class JpegPipeline {
 public:
  JpegPipeline(JpegFolder folder, PipelineOptions o);
  ~JpegPipeline();
  JpegPipeline(const JpegPipeline&) = delete;
  JpegPipeline& operator=(const JpegPipeline&) = delete;

  // The next decoded batch (blocks until one is ready). The caller hands it back with recycle().
  std::unique_ptr<HostBatch> next();
  void recycle(std::unique_ptr<HostBatch> b);

  std::size_t skipped() const { return skipped_.load(); }
  std::vector<std::string> skipped_examples() const;  // a few of the skipped files, with the reason
  std::size_t decoded() const { return decoded_.load(); }
  const PipelineOptions& options() const { return o_; }
  std::size_t num_classes() const { return folder_.classes.size(); }

 private:
  void worker(int id);

  JpegFolder folder_;
  PipelineOptions o_;
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::condition_variable ready_cv_, space_cv_;
  std::deque<std::unique_ptr<HostBatch>> ready_, free_;
  std::uint64_t next_ticket_ = 0;  // file cursor (in images) handed to workers
  std::vector<std::size_t> order_;
  bool stop_ = false;
  std::atomic<std::size_t> skipped_{0}, decoded_{0}, failed_in_a_row_{0};
  std::vector<std::string> skipped_examples_;
  std::string fatal_;
};

// Decodes one JPEG file, random-resized-crops it to size x size with bilinear sampling, flips it
// with probability 1/2 and normalises it into dst (3 x size x size in `layout`, dense). The random
// choices come from `rng_state`. Returns false with the reason for an unreadable or corrupt file.
bool decode_crop_normalise(const std::string& path, float* dst, const PipelineOptions& o, std::uint64_t rng_state,
                           std::string& why);

}  // namespace stepbench
