// The device's GEMM peak: measured on the backend's fully connected op, cached per machine.
#include "bench/peak.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include "bench/stats.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

constexpr const char* kFormat = "stepbench-peak-cache/1";

std::string utc_date() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char s[32];
  std::strftime(s, sizeof s, "%Y-%m-%d", &tm);
  return s;
}

// Values in [-1, 1) from a counter hash: data a GEMM cannot take shortcuts on (zeros draw less
// power on a GPU, whose clocks then run higher than in a real step).
void fill_pattern(Backend& b, Stream& s, void* dst, DType t, std::int64_t count) {
  constexpr std::int64_t kTile = 1 << 20;
  std::vector<float> host(static_cast<std::size_t>(std::min(count, kTile)));
  for (std::size_t i = 0; i < host.size(); ++i) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    host[i] = static_cast<float>(h >> 8) / static_cast<float>(1 << 23) - 1.0f;
  }
  Buffer staging(b, static_cast<std::size_t>(count) * sizeof(float));
  for (std::int64_t at = 0; at < count; at += kTile) {
    const std::int64_t n = std::min(kTile, count - at);
    b.copy(s, staging.as<float>() + at, host.data(), static_cast<std::size_t>(n) * sizeof(float));
  }
  if (t == DType::f32)
    b.copy(s, dst, staging.get(), staging.bytes());
  else
    b.cast(s, staging.get(), DType::f32, dst, t, static_cast<std::size_t>(count));
  b.synchronize(s);
}

}  // namespace

std::string peak_key(const Backend& b, Precision p) {
  std::string k = fmt::format("{} | {}", b.name(), b.device_name());
  for (const auto& [lib, v] : b.versions()) k += fmt::format(" | {}={}", lib, v);
  return k + fmt::format(" | {}", to_string(p));
}

Peak measure_gemm_peak(Backend& b, Precision p, double min_ms) {
  const DType t = storage_dtype(p);
  b.require(t);
  const std::int64_t n = b.kind() == DeviceKind::cpu ? 2048 : 8192;
  const auto x = TensorDesc::dense({n, n, 1, 1}, t, Layout::nchw);
  const auto op = b.make_linear(x, x);
  Buffer bx(b, x.bytes()), bw(b, x.bytes()), by(b, x.bytes()), bias(b, static_cast<std::size_t>(n) * 4),
      ws(b, op->workspace_bytes());
  Stream& s = b.default_stream();
  fill_pattern(b, s, bx.get(), t, n * n);
  fill_pattern(b, s, bw.get(), t, n * n);
  b.memset_zero(s, bias.get(), bias.bytes());
  const Tensor tx{bx.get(), x}, ty{by.get(), x};
  auto e0 = b.create_event(), e1 = b.create_event();
  const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  for (int i = 0; i < 2; ++i) op->forward(s, tx, bw.get(), bias.get(), ty, ws.get());  // warm-up
  b.synchronize(s);
  std::vector<double> tflops;
  double spent = 0;
  for (int tries = 0; tries < 1000 && tflops.size() < 50 && (tflops.size() < 3 || spent < min_ms); ++tries) {
    b.record(*e0, s);
    op->forward(s, tx, bw.get(), bias.get(), ty, ws.get());
    b.record(*e1, s);
    b.synchronize(s);
    const double ms = b.elapsed_ms(*e0, *e1);
    spent += ms;
    if (ms > 0) tflops.push_back(flop / (ms * 1e9));
  }
  SB_CHECK(!tflops.empty(), "the GEMM peak: no repetition took measurable time");
  Peak pk;
  pk.tflops = *std::max_element(tflops.begin(), tflops.end());
  pk.median_tflops = median(tflops);
  const std::string impl = op->implementation();
  pk.how = fmt::format("{}'s fully connected op{}, {} x {} x {} {}{}, best of {} after 2 warm-up calls",
                       b.kind() == DeviceKind::cpu ? "oneDNN" : "cuBLAS GemmEx (its bias add timed too)",
                       impl.empty() ? "" : " (" + impl.substr(0, impl.find(" /")) + ")", n, n, n, to_string(p),
                       b.kind() == DeviceKind::cpu ? fmt::format(" on {}", b.device_name()) : "", tflops.size());
  pk.source = "measured";
  pk.measured_at = utc_date();
  pk.machine = peak_key(b, p);
  return pk;
}

std::map<std::string, nlohmann::json> load_peak_cache(const std::string& path) {
  std::map<std::string, nlohmann::json> out;
  std::ifstream in(path);
  if (!in) return out;
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(
        fmt::format("--peak-cache {}: not a peak cache ({}); delete it or give another file", path, e.what()));
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat || !j.contains("peaks") ||
      !j["peaks"].is_object())
    throw UsageError(
        fmt::format("--peak-cache {}: not a peak cache (no \"format\": \"{}\" with \"peaks\"); delete "
                    "it or give another file",
                    path, kFormat));
  for (const auto& [k, v] : j["peaks"].items()) {
    const bool fields = v.is_object() && (!v.contains("how") || v["how"].is_string()) &&
                        (!v.contains("measured_at") || v["measured_at"].is_string()) &&
                        (!v.contains("median_tflops") || v["median_tflops"].is_number());
    if (!fields || !v.contains("tflops") || !v["tflops"].is_number() || !(v["tflops"].get<double>() > 0))
      throw UsageError(
          fmt::format("--peak-cache {}: the entry \"{}\" is not a peak (a positive \"tflops\", \"how\" and "
                      "\"measured_at\" as text); delete the file or give another --peak-cache",
                      path, k));
    out[k] = v;
  }
  return out;
}

void save_peak_cache(const std::string& path, const std::map<std::string, nlohmann::json>& entries) {
  nlohmann::json j = {{"format", kFormat}, {"peaks", nlohmann::json::object()}};
  for (const auto& [k, v] : entries) j["peaks"][k] = v;
  std::error_code ec;  // the default file's folder may not exist yet
  if (const auto dir = std::filesystem::path(path).parent_path(); !dir.empty())
    std::filesystem::create_directories(dir, ec);
  // a temporary file of this process's own: runs at once on one machine each rename a whole file
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);  // a home folder shared by several machines
  const std::string tmp = fmt::format("{}.{}.{}.partial", path, host, ::getpid());
  {
    std::ofstream f(tmp);
    f << j.dump(1) << "\n";
    f.close();  // a full disk shows at the flush
    if (!f) {
      std::remove(tmp.c_str());
      throw Error(fmt::format("could not write {} ({})", tmp, std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error(fmt::format("could not write {} ({})", path, why));
  }
}

Peak resolve_peak(Backend& b, Precision p, const PeakOptions& o) {
  Peak pk;
  pk.machine = peak_key(b, p);
  if (o.mode == PeakMode::off) {
    pk.note = "--peak off";
    return pk;
  }
  if (o.mode == PeakMode::given) {
    pk.tflops = o.given_tflops;
    pk.source = "given";
    pk.how = fmt::format("--peak {}", o.given_tflops);
    return pk;
  }
  std::map<std::string, nlohmann::json> entries;
  if (!o.cache.empty()) entries = load_peak_cache(o.cache);
  if (o.mode == PeakMode::automatic) {
    if (auto it = entries.find(pk.machine); it != entries.end()) {
      const auto& e = it->second;
      pk.tflops = e["tflops"].get<double>();
      pk.median_tflops = e.value("median_tflops", 0.0);
      pk.how = e.value("how", "");
      pk.measured_at = e.value("measured_at", "");
      pk.source = "cached";
      pk.file = o.cache;
      return pk;
    }
  }
  try {
    const std::string machine = pk.machine;
    pk = measure_gemm_peak(b, p);
    pk.machine = machine;
  } catch (const UnsupportedError& e) {
    pk.note = fmt::format("not measured: {}", e.what());
    return pk;
  }
  if (o.cache.empty()) return pk;
  try {  // what other runs wrote while this one measured
    entries = load_peak_cache(o.cache);
  } catch (const UsageError&) {  // damaged since: this run's figure replaces it
    entries.clear();
  }
  entries[pk.machine] = {
      {"tflops", pk.tflops}, {"median_tflops", pk.median_tflops}, {"how", pk.how}, {"measured_at", pk.measured_at}};
  try {
    save_peak_cache(o.cache, entries);
    pk.file = o.cache;
  } catch (const Error& e) {
    pk.note = fmt::format("measured, not cached: {}", e.what());
  }
  return pk;
}

nlohmann::json peak_json(const Peak& pk, double step_tflops, double forward_tflops) {
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json j = {{"tflops", pk.tflops > 0 ? nlohmann::json(pk.tflops) : nlohmann::json(nullptr)},
                      {"source", pk.source},
                      {"how", pk.how},
                      {"measured_at", pk.measured_at},
                      {"machine", pk.machine},
                      {"cache", pk.file},
                      {"step_tflops", num(step_tflops)},
                      {"forward_tflops", num(forward_tflops)}};
  if (pk.median_tflops > 0) j["median_tflops"] = pk.median_tflops;
  if (!pk.note.empty()) j["note"] = pk.note;
  j["step_share"] = num(pk.tflops > 0 ? step_tflops / pk.tflops : NAN);
  j["forward_share"] = num(pk.tflops > 0 ? forward_tflops / pk.tflops : NAN);
  return j;
}

}  // namespace stepbench
