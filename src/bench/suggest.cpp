#include "bench/suggest.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>

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
  // one row; a remedy that cannot run here (e.g. every sampled file is damaged) says why instead
  auto row = [&](const std::string& name, const std::function<double(std::string&)>& measure) {
    std::string note;
    try {
      const double ips = measure(note);
      rows.push_back({name, ips, note});
    } catch (const std::exception& e) {
      rows.push_back({name, 0, fmt::format("not measured: {}", e.what())});
    }
  };
  PipelineOptions po = f.pipeline_options();
  po.pin = nullptr;  // plain memory: nothing is copied to a device here
  const std::int64_t B = po.batch;
  const int T = po.threads;
  const std::string cores = fmt::format("{} cores here", std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  PipelineOptions twice = po;
  twice.threads = 2 * T;
  if (auto rec = f.records()) {
    row("as run (record file)", [&](std::string&) { return drain_rate(*std::make_unique<ImagePipeline>(rec, po), B); });
    row(fmt::format("--data-threads {}", 2 * T), [&](std::string& note) {
      note = cores;
      return drain_rate(*std::make_unique<ImagePipeline>(rec, twice), B);
    });
    return rows;
  }
  const std::size_t want = static_cast<std::size_t>(B) * static_cast<std::size_t>(2 * T + po.prefetch + 8) + 8;
  const ImageFolder s = sample(f.folder(), want);
  const std::size_t N = f.folder().files.size();
  PipelineOptions plain = po;
  plain.cache = InputCache::none;
  const bool cached_run = po.cache == InputCache::memory;
  if (cached_run)  // as run: the cache over the sample
    row("as run (--cache memory)",
        [&](std::string&) { return drain_rate(*std::make_unique<ImagePipeline>(s, po), B); });
  row(cached_run ? "without the cache" : "as run", [&](std::string& note) {
    note = fmt::format("{} files sampled of {}", s.files.size(), N);
    return drain_rate(*std::make_unique<ImagePipeline>(s, plain), B);
  });
  row(fmt::format("--data-threads {}", 2 * T), [&](std::string& note) {
    note = cores + (cached_run ? ", with the cache" : "");
    return drain_rate(*std::make_unique<ImagePipeline>(s, twice), B);
  });
  if (!cached_run)
    row("--cache memory", [&](std::string& note) {  // over the sample; the whole folder's bytes say whether it fits
      PipelineOptions pc = plain;
      pc.cache = InputCache::memory;
      pc.cache_limit_bytes = ~std::uint64_t{0};
      auto p = std::make_unique<ImagePipeline>(s, pc);
      const int R = p->store_size();
      const double whole = static_cast<double>(N) * R * R * 3;
      const double fill_rate = static_cast<double>(s.files.size()) / std::max(p->cache_fill_seconds(), 1e-9);
      note = fmt::format("the whole folder: {:.1f} MiB, filled in about {:.1f} s at start", whole / 1048576.0,
                         static_cast<double>(N) / fill_rate);
      const auto limit = cache_limit_bytes(po);
      if (whole > static_cast<double>(limit))
        note += fmt::format("; more than the {:.1f} MiB it may use: refused, use make-records", limit / 1048576.0);
      return drain_rate(*p, B);
    });
  // a record file of the sample, in the temporary folder, removed after
  const auto path = std::filesystem::temp_directory_path() /
                    fmt::format("stepbench-suggest-{}.records", static_cast<long>(::getpid()));
  row("make-records, --data OUT.records", [&](std::string& note) {
    struct Remove {
      const std::filesystem::path& p;
      ~Remove() {
        std::error_code ec;
        std::filesystem::remove(p, ec);
      }
    } remove{path};
    const auto t0 = Clock::now();
    const RecordsWritten w = write_records(s, path.string(), default_store_size(po.image_size), T);
    const double ws = std::chrono::duration<double>(Clock::now() - t0).count();
    auto rec = std::make_shared<const RecordFile>(path.string());
    const double per = static_cast<double>(w.bytes) / static_cast<double>(std::max<std::size_t>(w.images, 1));
    note = fmt::format("the whole folder: {:.1f} MiB on disk, written in about {:.1f} s",
                       per * static_cast<double>(N) / 1048576.0,
                       ws * static_cast<double>(N) / static_cast<double>(std::max<std::size_t>(s.files.size(), 1)));
    return drain_rate(*std::make_unique<ImagePipeline>(rec, plain), B);
  });
  return rows;
}

}  // namespace stepbench
