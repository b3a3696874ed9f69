// The convolution plan cache (plan_cache.hpp): a map under a mutex, and its JSON file.
#include "backend/plan_cache.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace stepbench {
namespace {

constexpr const char* kFormat = "stepbench-conv-plan-cache";
constexpr int kVersion = 1;

std::string describe(const TensorDesc& t) {
  return fmt::format("{}x{}x{}x{}/{},{},{},{}/{}/{}", t.shape.n, t.shape.c, t.shape.h, t.shape.w, t.strides.n,
                     t.strides.c, t.strides.h, t.strides.w, to_string(t.dtype), to_string(t.layout));
}

}  // namespace

const char* to_string(ConvDirection d) {
  switch (d) {
    case ConvDirection::forward: return "fwd";
    case ConvDirection::backward_data: return "bwd_data";
    case ConvDirection::backward_filter: return "bwd_filter";
  }
  return "?";
}

std::string conv_plan_key(const std::string& machine, ConvDirection d, const TensorDesc& x, const TensorDesc& y,
                          const ConvParams& p, const std::string& math, std::size_t workspace_limit) {
  // a grouped convolution's count after the padding (keys of ungrouped ones as before)
  return fmt::format("{} | {} | x {} | y {} | k {}x{} s {}x{} p {}x{}{} | {} | ws {}", machine, to_string(d),
                     describe(x), describe(y), p.kh, p.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w,
                     p.groups > 1 ? fmt::format(" g {}", p.groups) : "", math, workspace_limit);
}

std::optional<ConvPlan> ConvPlanCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(m_);
  const auto it = plans_.find(key);
  if (it == plans_.end()) return std::nullopt;
  ++reused_;
  return it->second;
}

ConvPlan ConvPlanCache::insert(const std::string& key, const ConvPlan& plan) {
  std::lock_guard<std::mutex> lock(m_);
  ++searched_;
  return plans_.emplace(key, plan).first->second;
}

std::size_t ConvPlanCache::size() const {
  std::lock_guard<std::mutex> lock(m_);
  return plans_.size();
}

std::string ConvPlanCache::path() const {
  std::lock_guard<std::mutex> lock(m_);
  return path_;
}

void ConvPlanCache::load(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(m_);
    path_ = path;
  }
  const auto bad = [&](const std::string& why) {
    return UsageError(fmt::format("--plan-cache {}: {}; delete the file or name another one", path, why));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return;  // not there yet: this run writes it
    throw bad(fmt::format("cannot be read ({})", std::strerror(err)));
  }
  std::stringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
  const auto format = j.find("format");
  if (format == j.end() || !format->is_string() || format->get<std::string>() != kFormat)
    throw bad(fmt::format("not a stepbench plan cache (no \"format\": \"{}\")", kFormat));
  const auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<std::int64_t>() != kVersion)
    throw bad(fmt::format("a plan cache of another format version (this build reads version {})", kVersion));
  const auto plans = j.find("plans");
  if (plans == j.end() || !plans->is_object()) throw bad("no \"plans\" object");
  // an integer in [lo, hi], or nothing
  const auto integer = [](const nlohmann::json& e, const char* k, std::int64_t lo, std::int64_t hi) {
    const auto it = e.find(k);
    if (it == e.end() || !it->is_number_integer()) return std::optional<std::int64_t>{};
    const auto v = it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(hi)
                       ? hi + 1
                       : it->get<std::int64_t>();
    return v < lo || v > hi ? std::optional<std::int64_t>{} : std::optional<std::int64_t>{v};
  };
  std::map<std::string, ConvPlan> read;
  for (const auto& [key, e] : plans->items()) {
    const auto algo = e.is_object() ? integer(e, "algo", 0, 255) : std::nullopt;
    const auto math = e.is_object() ? integer(e, "math", 0, 3) : std::nullopt;
    const auto ws = e.is_object() ? integer(e, "workspace", 0, std::int64_t{1} << 50) : std::nullopt;
    const auto ms = e.is_object() ? e.find("ms") : e.end();
    if (!algo || !math || !ws || (e.is_object() && ms != e.end() && !ms->is_number()))
      throw bad(fmt::format(
          "the entry \"{}\" is not {{\"algo\": 0-255, \"math\": 0-3, \"workspace\": bytes, \"ms\": number}}", key));
    ConvPlan p;
    p.algo = static_cast<int>(*algo);
    p.math = static_cast<int>(*math);
    p.workspace = static_cast<std::size_t>(*ws);
    p.ms = ms != e.end() ? ms->get<double>() : 0.0;
    read.emplace(key, p);
  }
  std::lock_guard<std::mutex> lock(m_);
  for (auto& [key, p] : read) plans_.emplace(key, p);  // a plan already searched in this run stays
  loaded_ = read.size();
}

void ConvPlanCache::replace(const std::string& key, const ConvPlan& plan) {
  std::lock_guard<std::mutex> lock(m_);
  ++searched_;
  plans_[key] = plan;
}

void ConvPlanCache::save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["plans"] = nlohmann::json::object();
  {
    std::lock_guard<std::mutex> lock(m_);
    for (const auto& [key, p] : plans_)
      j["plans"][key] = {{"algo", p.algo}, {"math", p.math}, {"workspace", p.workspace}, {"ms", p.ms}};
  }
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump(1) << '\n';
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(fmt::format("--plan-cache {}: cannot write {}", path, tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("--plan-cache {}: cannot replace it with {}", path, tmp));
  }
}

}  // namespace stepbench
