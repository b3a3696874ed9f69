#include "bench/suggest.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "tensor/error.hpp"

namespace stepbench {

namespace {

using Clock = std::chrono::steady_clock;

// Images per second that `p` delivers to a consumer that takes batches as fast as they come: two
// warm batches, then at least 4 batches and 0.3 s.
double drain_rate(ImagePipeline& p, std::int64_t batch) {
  for (int i = 0; i < 2; ++i) p.recycle(p.next());
  const auto t0 = Clock::now();
  std::int64_t n = 0;
  double s = 0;
  while (n < 4 || s < 0.3) {
    p.recycle(p.next());
    ++n;
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return static_cast<double>(n * batch) / s;
}

// Every k-th file of the folder, enough for the prefetch and a few batches: remedies are timed on
// the same sample as the baseline.
ImageFolder sample(const ImageFolder& f, std::size_t want) {
  if (f.files.size() <= want) return f;
  ImageFolder s;
  s.classes = f.classes;
  const double step = static_cast<double>(f.files.size()) / static_cast<double>(want);
  for (std::size_t i = 0; i < want; ++i) {
    const auto k = static_cast<std::size_t>(static_cast<double>(i) * step);
    s.files.push_back(f.files[k]);
    s.labels.push_back(f.labels[k]);
  }
  return s;
}

}  // namespace

std::vector<RemedyRow> run_suggest(const BenchConfig& c, const Feeder& f) {
  std::vector<RemedyRow> rows;
  PipelineOptions po = f.pipeline_options();
  po.pin = nullptr;  // plain memory: nothing is copied to a device here
  const std::int64_t B = po.batch;
  const int T = po.threads;
  if (auto rec = f.records()) {
    rows.push_back({"as run (record file)", drain_rate(*std::make_unique<ImagePipeline>(rec, po), B), ""});
    PipelineOptions p2 = po;
    p2.threads = 2 * T;
    rows.push_back({fmt::format("--data-threads {}", 2 * T), drain_rate(*std::make_unique<ImagePipeline>(rec, p2), B),
                    fmt::format("{} cores here", std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)))});
    return rows;
  }
  const std::size_t want = static_cast<std::size_t>(B) * static_cast<std::size_t>(2 * T + po.prefetch + 8) + 8;
  const ImageFolder s = sample(f.folder(), want);
  PipelineOptions plain = po;
  plain.cache = InputCache::none;
  const bool cached_run = po.cache == InputCache::memory;
  rows.push_back({cached_run ? "without the cache" : "as run",
                  drain_rate(*std::make_unique<ImagePipeline>(s, plain), B),
                  fmt::format("{} files sampled of {}", s.files.size(), f.folder().files.size())});
  PipelineOptions p2 = plain;
  p2.threads = 2 * T;
  rows.push_back({fmt::format("--data-threads {}", 2 * T), drain_rate(*std::make_unique<ImagePipeline>(s, p2), B),
                  fmt::format("{} cores here", std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)))});
  {  // the cache, over the sample; the whole folder's bytes say whether it would fit
    PipelineOptions pc = plain;
    pc.cache = InputCache::memory;
    pc.cache_limit_bytes = ~std::uint64_t{0};  // the sample always fits; the folder is judged below
    auto p = std::make_unique<ImagePipeline>(s, pc);
    const int R = p->store_size();
    const double whole = static_cast<double>(f.folder().files.size()) * R * R * 3;
    const double fill_rate = static_cast<double>(s.files.size()) / std::max(p->cache_fill_seconds(), 1e-9);
    std::string note = fmt::format("the whole folder: {:.1f} MiB, filled in about {:.1f} s at start", whole / 1048576.0,
                                   static_cast<double>(f.folder().files.size()) / fill_rate);
    if (c.cache_limit_mb && whole > static_cast<double>(c.cache_limit_mb << 20))
      note += fmt::format(" (more than --cache-limit-mb {})", c.cache_limit_mb);
    rows.push_back({"--cache memory", drain_rate(*p, B), note});
  }
  {  // a record file of the sample, in the temporary folder, removed after
    const auto path = std::filesystem::temp_directory_path() /
                      fmt::format("stepbench-suggest-{}.records", static_cast<long>(::getpid()));
    try {
      const auto t0 = Clock::now();
      const RecordsWritten w = write_records(s, path.string(), default_store_size(po.image_size), T);
      const double ws = std::chrono::duration<double>(Clock::now() - t0).count();
      auto rec = std::make_shared<const RecordFile>(path.string());
      const double rate = drain_rate(*std::make_unique<ImagePipeline>(rec, plain), B);
      std::filesystem::remove(path);
      const double per = static_cast<double>(w.bytes) / static_cast<double>(std::max<std::size_t>(w.images, 1));
      rows.push_back({"make-records, --data OUT.records", rate,
                      fmt::format("the whole folder: {:.1f} MiB on disk, written in about {:.1f} s",
                                  per * static_cast<double>(f.folder().files.size()) / 1048576.0,
                                  ws * static_cast<double>(f.folder().files.size()) /
                                      static_cast<double>(std::max<std::size_t>(w.images, 1)))});
    } catch (const Error& e) {
      std::error_code ec;
      std::filesystem::remove(path, ec);
      rows.push_back({"make-records, --data OUT.records", 0, fmt::format("not measured: {}", e.what())});
    }
  }
  return rows;
}

}  // namespace stepbench
