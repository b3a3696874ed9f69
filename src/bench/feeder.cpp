#include "bench/feeder.hpp"

#include <fmt/format.h>

#include <chrono>

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
  po_.batch = s.n;
  po_.image_size = s.h;
  po_.layout = t.options().layout;
  po_.threads = c.data_threads;
  po_.prefetch = c.prefetch;
  po_.cache = c.cache;
  po_.cache_limit_bytes = c.cache_limit_mb << 20;
  po_.pin = &t.backend(0);  // pinned batches: the staging copies are asynchronous DMA on a GPU
  po_.encoded = c.decode == DecodeOn::gpu;
  std::size_t classes = 0;
  if (c.data == DataKind::records) {
    records_ = std::make_shared<const RecordFile>(c.data_dir);
    classes = records_->classes().size();
  } else {
    folder_ = scan_image_folder(c.data_dir);
    classes = folder_.classes.size();
  }
  if (classes > 1000)
    throw UsageError(fmt::format("--data {}: {} classes, but the model has 1000 outputs", c.data_dir, classes));
  pipe_ = records_ ? std::make_unique<ImagePipeline>(records_, po_) : std::make_unique<ImagePipeline>(folder_, po_);
  if (po_.encoded) {
    ImageDecodeParams p;
    p.batch = static_cast<int>(s.n);
    p.store = pipe_->store_size();
    p.size = static_cast<int>(s.h);
    std::copy(std::begin(po_.mean), std::end(po_.mean), std::begin(p.mean));
    std::copy(std::begin(po_.stddev), std::end(po_.stddev), std::begin(p.stddev));
    for (int i = 0; i < t.size(); ++i) decoders_.push_back(t.backend(i).make_image_decoder(p));
    // one batch through each decoder, untimed: nvJPEG's first call, its buffers, the kernels' loading
    const TensorDesc d = TensorDesc::dense(s, DType::f32, po_.layout);
    for (int i = 0; i < t.size(); ++i) {
      Backend& be = t.backend(i);
      Buffer scratch(be, d.bytes());
      auto stream = be.create_stream();
      auto b = pipe_->next();
      decode_on_device(*decoders_[static_cast<std::size_t>(i)], be, *stream, *b, Tensor{scratch.get(), d}, *pipe_);
      pipe_->recycle(std::move(b));
    }
  }
}

void decode_on_device(ImageDecodeOp& dec, Backend& be, Stream& s, const HostBatch& b, const Tensor& out,
                      ImagePipeline& p) {
  std::vector<std::pair<const unsigned char*, std::size_t>> files;
  for (const auto& f : b.files) files.emplace_back(f.data(), f.size());
  const auto why = dec.decode(s, files, b.crops, out);
  std::vector<Image8> cpu;
  std::vector<HostRgb> rgb;
  std::vector<ImageCrop> crops;
  std::vector<int> slots;
  cpu.reserve(why.size());
  for (std::size_t i = 0; i < why.size(); ++i) {
    if (why[i].empty()) continue;
    std::string cpu_why;
    cpu.emplace_back();
    if (decode_image(b.files[i].data(), b.files[i].size(), cpu.back(), cpu_why)) {
      rgb.push_back({cpu.back().px.data(), cpu.back().w, cpu.back().h});
      crops.push_back(b.crops[i]);
      slots.push_back(static_cast<int>(i));
    } else {
      p.count_skipped(b.items[i], why[i] + "; on the CPU it " + cpu_why);
      const std::size_t floats = static_cast<std::size_t>(out.desc.numel() / out.desc.shape.n);
      be.memset_zero(s, static_cast<float*>(out.data) + i * floats, floats * sizeof(float));
    }
  }
  if (!rgb.empty()) dec.transform(s, rgb, crops, slots, out);
  be.synchronize(s);
}

// --decode gpu: the batch decoded on the tower's GPU, straight into its spare input buffer.
void Feeder::feed_decoded(int tower, HostBatch& b) {
  t_.stage_on_device(
      tower,
      [&](Stream& s, const Tensor& out) {
        decode_on_device(*decoders_.at(static_cast<std::size_t>(tower)), t_.backend(tower), s, b, out, *pipe_);
      },
      b.labels.data());
}

std::string Feeder::name() const {
  if (fixed_) return "synthetic-host";
  if (records_) return "records";
  if (!decoders_.empty()) return "images+gpu-decode";
  return po_.cache == InputCache::memory ? "images+cache" : "images";
}

void Feeder::feed() {
  for (int i = 0; i < t_.size(); ++i) {
    if (fixed_) {
      t_.stage(i, fixed_->images.data(), fixed_->labels.data());
    } else {
      auto b = pipe_->next();
      const auto t0 = std::chrono::steady_clock::now();
      if (decoders_.empty())
        t_.stage(i, b->images.data(), b->labels.data());  // returns when the copy is done
      else
        feed_decoded(i, *b);
      copy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      pipe_->recycle(std::move(b));
    }
  }
  t_.flip();
}

void Feeder::trace(bool on) {
  if (!active()) return;
  t_.set_staging_timing(on);
  if (pipe_) pipe_->trace_stages(on);
}

std::vector<std::vector<StageSpan>> Feeder::take_stage_spans() {
  return pipe_ ? pipe_->take_stage_spans() : std::vector<std::vector<StageSpan>>{};
}

StageTimes Feeder::stage_times() const {
  StageTimes s = pipe_ ? pipe_->stage_times() : StageTimes{};
  s[Stage::copy] = copy_s_;
  return s;
}

void Feeder::add_measure(const StageTimes& delta, double wall_s, double window_s, std::uint64_t images) {
  measure_.stages += delta;
  measure_.wall_s += wall_s;
  measure_.window_s += window_s;
  measure_.images += images;
  measure_.threads = c_.data_threads;
}

std::string Feeder::describe() const {
  if (fixed_) return "synthetic-host (one host batch, copied every step on a copy stream)";
  const std::string threads =
      fmt::format("{} decoding thread{}, prefetch {}", c_.data_threads, c_.data_threads == 1 ? "" : "s", c_.prefetch);
  if (records_) {
    const int R = records_->store_size(), want = default_store_size(po_.image_size);
    const std::string other = R == want
                                  ? ""
                                  : fmt::format(
                                        "; made for another crop size: a folder would be resized to {}x{} for this "
                                        "--image-size, so these crops differ from the plain pipeline's",
                                        want, want);
    return fmt::format("{} (record file: {} images of {}x{}, {} classes; {}{})", c_.data_dir, records_->size(), R, R,
                       records_->classes().size(), threads, other);
  }
  std::string kinds = folder_.png == 0    ? "JPEG files"
                      : folder_.jpeg == 0 ? "PNG files"
                                          : fmt::format("files: {} JPEG, {} PNG", folder_.jpeg, folder_.png);
  std::string cache;
  if (pipe_->cache_bytes() > 0)
    cache = fmt::format("; cached in memory: {:.1f} MiB at {}x{}, filled in {:.2f} s", pipe_->cache_bytes() / 1048576.0,
                        pipe_->store_size(), pipe_->store_size(), pipe_->cache_fill_seconds());
  if (!decoders_.empty())
    return fmt::format(
        "{} ({} {}, {} classes; decoded on the GPU: {} and stepbench's resize, crop and normalise; "
        "{} reading thread{}, prefetch {})",
        c_.data_dir, folder_.files.size(), kinds, folder_.classes.size(), decoders_[0]->library(), c_.data_threads,
        c_.data_threads == 1 ? "" : "s", c_.prefetch);
  return fmt::format("{} ({} {}, {} classes; {}{})", c_.data_dir, folder_.files.size(), kinds, folder_.classes.size(),
                     threads, cache);
}

std::string Feeder::skipped() const {
  if (!pipe_ || pipe_->skipped() == 0) return "";
  std::string ex;
  for (const auto& e : pipe_->skipped_examples()) ex += "\n  " + e;
  return fmt::format("{} unreadable or corrupt file{} skipped (of {} decoded), e.g.:{}", pipe_->skipped(),
                     pipe_->skipped() == 1 ? "" : "s", pipe_->decoded(), ex);
}

}  // namespace stepbench
