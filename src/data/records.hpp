// A record file: every image of a folder decoded and resized once (the pipeline's resize stage)
// to R x R 8-bit RGB, stored raw with its label, read memory-mapped. Reading one is a copy of
// R*R*3 bytes instead of a file read, a decode and a resize.
//
// Layout (little-endian, as written on x86-64): a 64-byte header
//   "SBREC01\n", u64 count, u32 R, u32 classes, u64 names_off, u64 names_bytes, u64 images_off,
//   u64 labels_off;
// the class names, each ending in '\0'; the images at images_off (a multiple of 4096), count x
// R*R*3 bytes; the labels at labels_off (the next multiple of 64), count x i32; nothing after them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace stepbench {

struct ImageFolder;

struct RecordsWritten {
  std::size_t images = 0, skipped = 0;
  std::vector<std::string> skipped_examples;  // a few, with the reason
  std::uint64_t bytes = 0;
};
// Decodes and resizes every file of `folder` to R x R on `threads` threads and writes `out`
// (through out.partial, renamed when complete). Unreadable files are left out and counted.
// Throws UsageError when nothing could be decoded or `out` cannot be written.
RecordsWritten write_records(const ImageFolder& folder, const std::string& out, int R, int threads);

class RecordFile {
 public:
  // Maps `path`. Throws UsageError, saying what is wrong, for a file that is not a record file or
  // whose sizes disagree with its header (truncated, or not written to the end).
  explicit RecordFile(const std::string& path);
  ~RecordFile();
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;

  static bool looks_like_records(const std::string& path);  // a regular file that starts with the magic

  std::size_t size() const { return count_; }
  int store_size() const { return R_; }
  const std::vector<std::string>& classes() const { return classes_; }
  std::int32_t label(std::size_t i) const { return labels_[i]; }
  const unsigned char* image(std::size_t i) const { return images_ + i * image_bytes(); }
  std::size_t image_bytes() const { return static_cast<std::size_t>(R_) * R_ * 3; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::size_t count_ = 0;
  int R_ = 0;
  std::vector<std::string> classes_;
  const unsigned char* images_ = nullptr;
  const std::int32_t* labels_ = nullptr;
};

}  // namespace stepbench
