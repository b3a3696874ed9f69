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

// Images per second of batches of `batch` taken by `one` (one batch taken and handed back), as fast
// as they come: two warm batches, then at least 4 batches and 0.3 s.
double drain(const std::function<void()>& one, std::int64_t batch) {
  for (int i = 0; i < 2; ++i) one();
  const auto t0 = Clock::now();
  std::int64_t n = 0;
  double s = 0;
  while (n < 4 || s < 0.3) {
    one();
    ++n;
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return static_cast<double>(n * batch) / s;
}
double drain_rate(ImagePipeline& p, std::int64_t batch) {
  return drain([&p] { p.recycle(p.next()); }, batch);
}

// The same with --decode gpu: the pipeline's threads read the files, the device decodes and
// transforms each batch into one batch tensor (the step's thread's part in the run).
double drain_decoded(const ImageFolder& s, const PipelineOptions& po, Backend& be, const ImageDecoderMaker& make,
                     std::string& note) {
  PipelineOptions pe = po;
  pe.encoded = true;
  pe.cache = InputCache::none;
  ImageDecodeParams dp;  // the decoder first: where there is none, no pipeline starts
  dp.batch = static_cast<int>(pe.batch);
  dp.store = pe.store_size > 0 ? pe.store_size : default_store_size(pe.image_size);
  dp.size = static_cast<int>(pe.image_size);
  std::copy(std::begin(pe.mean), std::end(pe.mean), std::begin(dp.mean));
  std::copy(std::begin(pe.stddev), std::end(pe.stddev), std::begin(dp.stddev));
  auto dec = make(dp);
  const Shape shape{pe.batch, 3, pe.image_size, pe.image_size};
  Buffer buf(be, static_cast<std::size_t>(shape.numel()) * sizeof(float));
  const Tensor out{buf.get(), TensorDesc::dense(shape, DType::f32, pe.layout)};
  auto stream = be.create_stream();
  ImagePipeline p(s, pe);
  SB_CHECK(p.store_size() == dp.store, "the pipeline's stored size is the decoder's");
  const double ips = drain(
      [&] {
        auto b = p.next();
        decode_on_device(*dec, be, *stream, *b, out, p);
        p.recycle(std::move(b));
      },
      pe.batch);
  note = dec->library() + (note.empty() ? "" : "; " + note);
  if (p.skipped() > 0)
    note += fmt::format("; {} files skipped (unreadable, or neither nvJPEG nor the CPU decoded them)", p.skipped());
  return ips;
}

// Every k-th file of the folder, enough for the prefetch and a few batches: remedies are timed on
// the same sample as the baseline.
ImageFolder sample(const ImageFolder& f, std::size_t want) {
  if (f.files.size() <= want) return f;
  ImageFolder s;
  s.classes = f.classes;
  s.jpeg = f.jpeg;  // the whole folder's kinds: --decode gpu refuses a folder holding PNG files
  s.png = f.png;
  const double step = static_cast<double>(f.files.size()) / static_cast<double>(want);
  for (std::size_t i = 0; i < want; ++i) {
    const auto k = static_cast<std::size_t>(static_cast<double>(i) * step);
    s.files.push_back(f.files[k]);
    s.labels.push_back(f.labels[k]);
  }
  return s;
}

}  // namespace

std::vector<RemedyRow> run_suggest(const PipelineOptions& run, const ImageFolder& folder,
                                   const std::shared_ptr<const RecordFile>& records, Backend& device,
                                   const ImageDecoderMaker& make_decoder) {
  std::vector<RemedyRow> rows;
  // one row; a remedy that cannot run here (e.g. every sampled file is damaged) says why instead
  auto row = [&](const std::string& name, const std::function<double(RemedyRow&)>& measure) {
    RemedyRow r{name, 0, ""};
    try {
      r.images_per_s = measure(r);
    } catch (const std::exception& e) {
      r = RemedyRow{name, 0, fmt::format("not measured: {}", e.what())};
    }
    rows.push_back(r);
  };
  PipelineOptions po = run;
  po.pin = nullptr;  // plain memory: nothing is copied to a device here
  const std::int64_t B = po.batch;
  const int T = po.threads;
  const std::string cores = fmt::format("{} cores here", std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  PipelineOptions twice = po;
  twice.threads = 2 * T;
  if (records) {
    row("as run (record file)",
        [&](RemedyRow&) { return drain_rate(*std::make_unique<ImagePipeline>(records, po), B); });
    row(fmt::format("--data-threads {}", 2 * T), [&](RemedyRow& r) {
      r.note = cores;
      return drain_rate(*std::make_unique<ImagePipeline>(records, twice), B);
    });
    return rows;
  }
  const std::size_t want = static_cast<std::size_t>(B) * static_cast<std::size_t>(2 * T + po.prefetch + 8) + 8;
  const ImageFolder s = sample(folder, want);
  const std::size_t N = folder.files.size();
  const std::string sampled = fmt::format("{} files sampled of {}", s.files.size(), N);
  const std::string alone = "the GPU decoding alone (in the run it shares the GPU with the step)";
  PipelineOptions plain = po;  // the CPU's decode, no cache
  plain.cache = InputCache::none;
  plain.encoded = false;
  const bool cached_run = po.cache == InputCache::memory, gpu_run = po.encoded;
  // the remedies that the run's own --cache or --decode gpu exclude say what to change with them
  const std::string but = cached_run ? " (drop --cache)" : gpu_run ? " (drop --decode gpu)" : "";
  if (gpu_run) {  // as run, and with twice the threads that read the files, on the device
    row("as run (--decode gpu)", [&](RemedyRow& r) {
      r.on_device = true;
      r.note = sampled + "; " + alone;
      return drain_decoded(s, po, device, make_decoder, r.note);
    });
    row(fmt::format("--data-threads {}", 2 * T), [&](RemedyRow& r) {
      r.on_device = true;
      r.note = cores + "; the threads only read";
      return drain_decoded(s, twice, device, make_decoder, r.note);
    });
    row("--decode cpu", [&](RemedyRow& r) {
      r.note = fmt::format("libjpeg-turbo on {} thread{}", T, T == 1 ? "" : "s");
      return drain_rate(*std::make_unique<ImagePipeline>(s, plain), B);
    });
  } else {
    if (cached_run)  // as run: the cache over the sample
      row("as run (--cache memory)",
          [&](RemedyRow&) { return drain_rate(*std::make_unique<ImagePipeline>(s, po), B); });
    row(cached_run ? "without the cache" : "as run", [&](RemedyRow& r) {
      r.note = sampled;
      return drain_rate(*std::make_unique<ImagePipeline>(s, plain), B);
    });
    row(fmt::format("--data-threads {}", 2 * T), [&](RemedyRow& r) {
      r.note = cores + (cached_run ? ", with the cache" : "");
      return drain_rate(*std::make_unique<ImagePipeline>(s, twice), B);
    });
  }
  if (!cached_run)
    row(gpu_run ? "--decode cpu --cache memory" : "--cache memory", [&](RemedyRow& r) {
      // over the sample; the whole folder's bytes say whether the run may have it
      PipelineOptions pc = plain;
      pc.cache = InputCache::memory;
      pc.cache_limit_bytes = ~std::uint64_t{0};
      auto p = std::make_unique<ImagePipeline>(s, pc);
      const int R = p->store_size();
      const double whole = static_cast<double>(N) * R * R * 3;
      const double fill_rate = static_cast<double>(s.files.size()) / std::max(p->cache_fill_seconds(), 1e-9);
      r.note = fmt::format("the whole folder: {:.1f} MiB, filled in about {:.1f} s at start", whole / 1048576.0,
                           static_cast<double>(N) / fill_rate);
      const auto limit = cache_limit_bytes(po);
      if (whole > static_cast<double>(limit)) {
        r.note += fmt::format("; more than the {:.1f} MiB it may use: refused, use make-records", limit / 1048576.0);
        r.applies = false;
      }
      return drain_rate(*p, B);
    });
  // a record file of the sample, in the temporary folder, removed after
  const auto path = std::filesystem::temp_directory_path() /
                    fmt::format("stepbench-suggest-{}.records", static_cast<long>(::getpid()));
  row("make-records, --data OUT.records" + but, [&](RemedyRow& r) {
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
    r.note = fmt::format("the whole folder: {:.1f} MiB on disk, written in about {:.1f} s",
                         per * static_cast<double>(N) / 1048576.0,
                         ws * static_cast<double>(N) / static_cast<double>(std::max<std::size_t>(s.files.size(), 1)));
    return drain_rate(*std::make_unique<ImagePipeline>(rec, plain), B);
  });
  if (!gpu_run)
    row("--decode gpu" + but, [&](RemedyRow& r) {
      if (folder.png > 0)  // nvJPEG decodes JPEG files only
        throw UsageError(
            fmt::format("nvJPEG decodes JPEG files and the folder holds {} PNG file{} (a record file needs no decode: "
                        "make-records)",
                        folder.png, folder.png == 1 ? "" : "s"));
      r.on_device = true;
      r.note = alone;
      return drain_decoded(s, po, device, make_decoder, r.note);
    });
  return rows;
}

}  // namespace stepbench
