// A temporary folder for a test (the tests of the data pipeline, record files, plan caches, run files).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace stepbench::test {

// A folder of its own under the system's temporary folder, removed with everything in it at the
// end of the scope; "stepbench-<tag>-<pid>-<n>", unique within the process.
struct TempDir {
  std::filesystem::path p;
  explicit TempDir(const std::string& tag = "test") {
    static int n = 0;
    p = std::filesystem::temp_directory_path() /
        ("stepbench-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::create_directories(p);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return p.string(); }
  // The path of `name` in it, with `text` written there (an empty file for "").
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(p / name) << text;
    return (p / name).string();
  }
  // The path of `name` in it; `text` written there when not empty.
  std::string file(const std::string& name, const std::string& text = "") const {
    return text.empty() ? (p / name).string() : write(name, text);
  }
};

}  // namespace stepbench::test
