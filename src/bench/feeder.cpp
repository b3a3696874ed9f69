#include "bench/feeder.hpp"

#include <fmt/format.h>

#include "tensor/error.hpp"

namespace stepbench {

Feeder::Feeder(const BenchConfig& c, Towers& t) : c_(c), t_(t) {
  if (c.data == DataKind::synthetic) return;
  t.enable_staging();
  const Shape s = t.graph(0).input_tensor().shape();
  if (c.data == DataKind::synthetic_host) {
    // one host batch, staged to every tower; pinned where the backend pins
    fixed_ =
        std::make_unique<HostBatch>(static_cast<std::size_t>(s.numel()), static_cast<std::size_t>(s.n), &t.backend(0));
    std::uint64_t x = 12345;
    for (auto& v : fixed_->images) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<double>(x >> 40) / (1ull << 24) * 2.0 - 1.0);
    }
    for (std::size_t i = 0; i < fixed_->labels.size(); ++i) fixed_->labels[i] = static_cast<std::int32_t>(i % 1000);
    return;
  }
  JpegFolder folder = scan_jpeg_folder(c.data_dir);
  if (folder.classes.size() > 1000)
    throw UsageError(
        fmt::format("--data {}: {} classes, but the model has 1000 outputs", c.data_dir, folder.classes.size()));
  files_ = folder.files.size();
  classes_ = folder.classes.size();
  PipelineOptions po;
  po.batch = s.n;
  po.image_size = s.h;
  po.layout = t.options().layout;
  po.threads = c.data_threads;
  po.prefetch = c.prefetch;
  po.pin = &t.backend(0);  // pinned batches: the staging copies are asynchronous DMA on a GPU
  pipe_ = std::make_unique<JpegPipeline>(std::move(folder), po);
}

void Feeder::feed() {
  for (int i = 0; i < t_.size(); ++i) {
    if (fixed_) {
      t_.stage(i, fixed_->images.data(), fixed_->labels.data());
    } else {
      auto b = pipe_->next();
      t_.stage(i, b->images.data(), b->labels.data());
      pipe_->recycle(std::move(b));
    }
  }
  t_.flip();
}

std::string Feeder::describe() const {
  if (fixed_) return "synthetic-host (one host batch, copied every step on a copy stream)";
  return fmt::format("{} ({} JPEG files, {} classes; {} decoding thread{}, prefetch {})", c_.data_dir, files_, classes_,
                     c_.data_threads, c_.data_threads == 1 ? "" : "s", c_.prefetch);
}

std::string Feeder::skipped() const {
  if (!pipe_ || pipe_->skipped() == 0) return "";
  std::string ex;
  for (const auto& e : pipe_->skipped_examples()) ex += "\n  " + e;
  return fmt::format("{} unreadable or corrupt file{} skipped (of {} decoded), e.g.:{}", pipe_->skipped(),
                     pipe_->skipped() == 1 ? "" : "s", pipe_->decoded(), ex);
}

}  // namespace stepbench
