// The convolution plan cache (plan_cache.hpp): a map under a mutex, and its JSON file.
#include "backend/plan_cache.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
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
  return fmt::format("{} | {} | x {} | y {} | k {}x{} s {}x{} p {}x{} | {} | ws {}", machine, to_string(d), describe(x),
                     describe(y), p.kh, p.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w, math, workspace_limit);
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
  std::ifstream in(path, std::ios::binary);
  {
    std::lock_guard<std::mutex> lock(m_);
    path_ = path;
  }
  if (!in) return;  // not there yet: this run writes it
  const auto bad = [&](const std::string& why) {
    return UsageError(fmt::format("--plan-cache {}: {}; delete the file or name another one", path, why));
  };
  std::stringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
  if (j.value("format", "") != kFormat)
    throw bad(fmt::format("not a stepbench plan cache (no \"format\": \"{}\")", kFormat));
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != kVersion)
    throw bad(fmt::format("a plan cache of another format version (this build reads version {})", kVersion));
  if (!j.contains("plans") || !j["plans"].is_object()) throw bad("no \"plans\" object");
  std::map<std::string, ConvPlan> read;
  for (const auto& [key, e] : j["plans"].items()) {
    const bool ok = e.is_object() && e.contains("algo") && e["algo"].is_number_integer() && e.contains("math") &&
                    e["math"].is_number_integer() && e.contains("workspace") && e["workspace"].is_number_unsigned() &&
                    (!e.contains("ms") || e["ms"].is_number());
    if (!ok || e["algo"].get<long long>() < 0 || e["math"].get<long long>() < 0)
      throw bad(
          fmt::format("the entry \"{}\" is not {{\"algo\": int >= 0, \"math\": int >= 0, \"workspace\": bytes}}", key));
    ConvPlan p;
    p.algo = e["algo"].get<int>();
    p.math = e["math"].get<int>();
    p.workspace = e["workspace"].get<std::size_t>();
    p.ms = e.value("ms", 0.0);
    read.emplace(key, p);
  }
  std::lock_guard<std::mutex> lock(m_);
  for (auto& [key, p] : read) plans_.emplace(key, p);  // a plan already searched in this run stays
  loaded_ = read.size();
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
