// The device's GEMM peak (bench/peak.cpp): measured on the CPU backend's fully connected op, kept
// in and read back from the cache file, one entry per machine and precision, a damaged file refused
// with a UsageError that names it, and --json's shares.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/registry.hpp"
#include "bench/peak.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("stepbench_peak_test." + std::to_string(::getpid()));
  TempDir() { std::filesystem::remove_all(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(Peak, KeyNamesTheDeviceLibrariesAndPrecision) {
  auto b = make_cpu_backend();
  const std::string fp32 = peak_key(*b, Precision::fp32), bf16 = peak_key(*b, Precision::bf16);
  EXPECT_NE(fp32, bf16);
  EXPECT_NE(fp32.find(b->device_name()), std::string::npos) << fp32;
  EXPECT_NE(fp32.find("onednn"), std::string::npos) << fp32;  // Backend::versions' library
  EXPECT_EQ(fp32, peak_key(*b, Precision::fp32));             // stable: the cache finds it again
}

TEST(Peak, MeasuredOnTheCpuGemmIsPositiveAndItsMedianNotAboveTheBest) {
  auto b = make_cpu_backend();
  const Peak pk = measure_gemm_peak(*b, Precision::fp32, 1);  // the 3 repetitions at least
  EXPECT_GT(pk.tflops, 0);
  EXPECT_GT(pk.median_tflops, 0);
  EXPECT_LE(pk.median_tflops, pk.tflops);  // the peak is the best repetition
  EXPECT_EQ(pk.source, "measured");
  EXPECT_EQ(pk.machine, peak_key(*b, Precision::fp32));
  EXPECT_NE(pk.how.find("2048 x 2048 x 2048 fp32"), std::string::npos) << pk.how;
  EXPECT_EQ(pk.measured_at.size(), 10u) << pk.measured_at;  // YYYY-MM-DD
}

TEST(Peak, AutoMeasuresOnceThenReadsTheCache) {
  TempDir d;
  auto b = make_cpu_backend();
  PeakOptions o;
  o.mode = PeakMode::automatic;
  o.cache = (d.path / "sub" / "peak.json").string();  // its folder made on the first write
  const Peak first = resolve_peak(*b, Precision::fp32, o);
  ASSERT_EQ(first.source, "measured") << first.note;
  EXPECT_EQ(first.file, o.cache);
  const Peak second = resolve_peak(*b, Precision::fp32, o);
  EXPECT_EQ(second.source, "cached");
  EXPECT_DOUBLE_EQ(second.tflops, first.tflops);
  EXPECT_EQ(second.how, first.how);
  const auto entries = load_peak_cache(o.cache);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries.begin()->first, peak_key(*b, Precision::fp32));
  for (const auto& f : std::filesystem::directory_iterator(d.path / "sub"))  // no temporary file left
    EXPECT_EQ(f.path().filename(), "peak.json");

  // another machine's entry stays; measure replaces this machine's and keeps the other
  auto kept = entries;
  kept["another machine | fp32"] = {{"tflops", 123.0}};
  save_peak_cache(o.cache, kept);
  o.mode = PeakMode::measure;
  const Peak again = resolve_peak(*b, Precision::fp32, o);
  EXPECT_EQ(again.source, "measured");
  const auto after = load_peak_cache(o.cache);
  EXPECT_EQ(after.size(), 2u);
  EXPECT_DOUBLE_EQ(after.at("another machine | fp32")["tflops"].get<double>(), 123.0);
  EXPECT_DOUBLE_EQ(after.at(again.machine)["tflops"].get<double>(), again.tflops);
}

TEST(Peak, GivenAndOffMeasureNothing) {
  auto b = make_cpu_backend();
  PeakOptions o;
  o.mode = PeakMode::given;
  o.given_tflops = 1.5;
  o.cache = "/nonexistent/folder/peak.json";
  const Peak given = resolve_peak(*b, Precision::fp32, o);
  EXPECT_EQ(given.source, "given");
  EXPECT_DOUBLE_EQ(given.tflops, 1.5);
  o.mode = PeakMode::off;
  const Peak off = resolve_peak(*b, Precision::fp32, o);
  EXPECT_EQ(off.tflops, 0);
  EXPECT_EQ(off.source, "");
}

TEST(Peak, DamagedCacheIsRefusedNamingTheFile) {
  TempDir d;
  std::filesystem::create_directories(d.path);
  const auto p = d.path / "peak.json";
  for (const char* text : {"{not json", "[1, 2]", R"({"format": "other/1", "peaks": {}})", R"({"format": 1})",
                           R"({"format": "stepbench-peak-cache/1", "peaks": {"m": {"tflops": 1, "how": 5}}})",
                           R"({"format": "stepbench-peak-cache/1", "peaks": {"m": {"tflops": -1}}})",
                           R"({"format": "stepbench-peak-cache/1", "peaks": {"m": {"how": "x"}}})"}) {
    write(p, text);
    try {
      load_peak_cache(p.string());
      ADD_FAILURE() << "accepted: " << text;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(load_peak_cache((d.path / "missing.json").string()).empty());  // none yet: empty
}

TEST(Peak, UnwritableCacheIsANoteAndTheFigureStands) {
  auto b = make_cpu_backend();
  PeakOptions o;
  o.mode = PeakMode::measure;
  o.cache = "/proc/stepbench-no/peak.json";
  const Peak pk = resolve_peak(*b, Precision::fp32, o);
  EXPECT_GT(pk.tflops, 0);
  EXPECT_EQ(pk.file, "");
  EXPECT_NE(pk.note.find("not cached"), std::string::npos) << pk.note;
}

TEST(Peak, JsonGivesTheSharesAndNullForWhatWasNotTimed) {
  Peak pk;
  pk.tflops = 2.0;
  pk.source = "given";
  const auto j = peak_json(pk, 0.5, NAN);
  EXPECT_DOUBLE_EQ(j["step_share"].get<double>(), 0.25);
  EXPECT_TRUE(j["forward_share"].is_null());
  EXPECT_TRUE(j["forward_tflops"].is_null());
  const auto none = peak_json(Peak{}, 0.5, 0.25);
  EXPECT_TRUE(none["tflops"].is_null());
  EXPECT_TRUE(none["step_share"].is_null());
  EXPECT_DOUBLE_EQ(none["step_tflops"].get<double>(), 0.5);
}

}  // namespace
}  // namespace stepbench
