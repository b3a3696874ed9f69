#include "data/records.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "data/data.hpp"
#include "tensor/error.hpp"

namespace stepbench {

namespace {

constexpr char kMagic[8] = {'S', 'B', 'R', 'E', 'C', '0', '1', '\n'};

struct Header {
  char magic[8];
  std::uint64_t count;
  std::uint32_t R, classes;
  std::uint64_t names_off, names_bytes, images_off, labels_off;
};
static_assert(sizeof(Header) == 56);
constexpr std::uint64_t kHeaderBytes = 64;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

RecordsWritten write_records(const ImageFolder& folder, const std::string& out, int R, int threads) {
  if (R < 8 || R > 4096) throw UsageError(fmt::format("make-records: --store-size {} must be 8 to 4096", R));
  if (threads < 1) throw UsageError(fmt::format("make-records: --threads {} must be at least 1", threads));
  const std::string partial = out + ".partial";
  std::ofstream f(partial, std::ios::binary | std::ios::trunc);
  if (!f) throw UsageError(fmt::format("make-records: cannot write {} ({})", partial, std::strerror(errno)));
  struct RemovePartial {  // on every way out but the rename
    const std::string& path;
    bool keep = false;
    ~RemovePartial() {
      std::error_code ec;
      if (!keep) std::filesystem::remove(path, ec);
    }
  } cleanup{partial};
  std::string names;
  for (const auto& c : folder.classes) names += c + '\0';
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.R = static_cast<std::uint32_t>(R);
  h.classes = static_cast<std::uint32_t>(folder.classes.size());
  h.names_off = kHeaderBytes;
  h.names_bytes = names.size();
  h.images_off = align_up(kHeaderBytes + names.size(), 4096);
  std::vector<char> head(h.images_off, '\0');
  std::memcpy(head.data() + kHeaderBytes, names.data(), names.size());
  f.write(head.data(), static_cast<std::streamsize>(head.size()));

  // Chunks of images decoded in parallel, written in order.
  const std::size_t img = static_cast<std::size_t>(R) * R * 3;
  // a chunk of at most 256 MiB (and at least one image per thread)
  const std::size_t chunk =
      std::max<std::size_t>(static_cast<std::size_t>(threads),
                            std::min<std::size_t>(static_cast<std::size_t>(threads) * 16, (256u << 20) / img));
  std::vector<unsigned char> buf(chunk * img);
  std::vector<std::string> why(chunk);
  RecordsWritten w;
  std::vector<std::int32_t> labels;
  for (std::size_t base = 0; base < folder.files.size(); base += chunk) {
    const std::size_t n = std::min(chunk, folder.files.size() - base);
    std::atomic<std::size_t> next{0};
    auto work = [&] {
      std::vector<unsigned char> file, stored;
      Image8 im;
      for (std::size_t i; (i = next.fetch_add(1)) < n;) {
        why[i].clear();
        try {  // an allocation that fails for one image leaves that image out
          if (read_file(folder.files[base + i], file, why[i]) && decode_image(file.data(), file.size(), im, why[i])) {
            resize_to_store(im, R, stored);
            std::memcpy(buf.data() + i * img, stored.data(), img);
          } else if (why[i].empty()) {
            why[i] = "could not be decoded";
          }
        } catch (const std::exception& e) {
          why[i] = fmt::format("could not be decoded ({})", e.what());
        }
      }
    };
    {
      std::vector<std::jthread> pool;  // joined on every way out
      for (int t = 1; t < threads; ++t) pool.emplace_back(work);
      work();
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!why[i].empty()) {
        ++w.skipped;
        if (w.skipped_examples.size() < 5) w.skipped_examples.push_back(folder.files[base + i] + " " + why[i]);
        continue;
      }
      f.write(reinterpret_cast<const char*>(buf.data() + i * img), static_cast<std::streamsize>(img));
      labels.push_back(folder.labels[base + i]);
    }
    if (!f) throw UsageError(fmt::format("make-records: writing {} failed (disk full?)", partial));
  }
  if (labels.empty()) {
    f.close();
    throw UsageError(fmt::format("make-records: no file could be decoded, e.g. {}",
                                 w.skipped_examples.empty() ? "" : w.skipped_examples.front()));
  }
  h.count = labels.size();
  h.labels_off = align_up(h.images_off + h.count * img, 64);
  f.write(head.data(), static_cast<std::streamsize>(h.labels_off - (h.images_off + h.count * img)));  // zeros
  f.write(reinterpret_cast<const char*>(labels.data()), static_cast<std::streamsize>(labels.size() * 4));
  f.seekp(0);
  f.write(reinterpret_cast<const char*>(&h), sizeof h);
  f.close();
  if (!f) throw UsageError(fmt::format("make-records: writing {} failed (disk full?)", partial));
  std::error_code ec;
  std::filesystem::rename(partial, out, ec);
  if (ec) throw UsageError(fmt::format("make-records: cannot rename {} to {}: {}", partial, out, ec.message()));
  cleanup.keep = true;
  w.images = labels.size();
  w.bytes = h.labels_off + h.count * 4;
  return w;
}

bool RecordFile::looks_like_records(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char m[8] = {};
  return in.read(m, 8) && std::memcmp(m, kMagic, 8) == 0;
}

RecordFile::RecordFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UsageError(fmt::format("--data {}: cannot open ({})", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError(fmt::format("--data {}: not a regular file", path));
  }
  const auto bytes = static_cast<std::uint64_t>(st.st_size);
  const auto bad = [&](const std::string& what) {
    return UsageError(fmt::format("--data {}: {}; stepbench make-records DIR {} writes one", path, what, path));
  };
  if (bytes < kHeaderBytes) {
    ::close(fd);
    throw bad("not a stepbench record file (shorter than its header)");
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw UsageError(fmt::format("--data {}: cannot map ({})", path, std::strerror(errno)));
  map_ = m;
  map_bytes_ = bytes;
  try {
    Header h{};
    std::memcpy(&h, m, sizeof h);
    if (std::memcmp(h.magic, kMagic, 8) != 0) throw bad("not a stepbench record file (no SBREC01 signature)");
    // Every sum below is bounded before it is formed: a crafted header must not wrap around 2^64.
    if (h.R < 8 || h.R > 4096 || h.count == 0 || h.count > (1ull << 40) || h.names_off != kHeaderBytes ||
        h.images_off % 4096 != 0 || h.images_off > (1ull << 50) || h.images_off < h.names_off ||
        h.names_bytes > h.images_off - h.names_off)
      throw bad("its header is damaged");
    const std::uint64_t img = static_cast<std::uint64_t>(h.R) * h.R * 3;  // < 2^26
    if (h.count > (1ull << 60) / img) throw bad("its header is damaged");
    const std::uint64_t images_end = h.images_off + h.count * img;  // < 2^50 + 2^60
    if (h.labels_off != align_up(images_end, 64)) throw bad("its header is damaged");
    const std::uint64_t want = h.labels_off + h.count * 4;
    if (want != bytes)
      throw bad(fmt::format("{} bytes where its header says {} (truncated, or still being written)", bytes, want));
    const char* names = static_cast<const char*>(m) + h.names_off;
    for (std::uint64_t i = 0, s = 0; i < h.names_bytes; ++i)
      if (names[i] == '\0') {
        classes_.emplace_back(names + s, i - s);
        s = i + 1;
      }
    if (classes_.size() != h.classes) throw bad("its class names are damaged");
    count_ = h.count;
    R_ = static_cast<int>(h.R);
    images_ = static_cast<const unsigned char*>(m) + h.images_off;
    labels_ = reinterpret_cast<const std::int32_t*>(static_cast<const char*>(m) + h.labels_off);
    for (std::size_t i = 0; i < count_; ++i)
      if (labels_[i] < 0 || static_cast<std::uint32_t>(labels_[i]) >= h.classes)
        throw bad(fmt::format("image {} has label {} of {} classes", i, labels_[i], h.classes));
  } catch (...) {
    ::munmap(map_, map_bytes_);
    throw;
  }
}

RecordFile::~RecordFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

}  // namespace stepbench
