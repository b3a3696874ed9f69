#include "compare/compare.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "compare/stats.hpp"

namespace stepbench::compare {

using nlohmann::json;

std::string benchmark_key(const std::string& name) {
  static const std::regex suffix("/repeats:[0-9]+|/manual_time|/real_time|/process_time");
  return std::regex_replace(name, suffix, "");
}

const std::vector<std::string>& fingerprint_keys() {
  static const std::vector<std::string> k = {"backend",
                                             "device",
                                             "host_name",
                                             "num_cpus",
                                             "cpu_isa",
                                             "cpu_kernels",
                                             "omp_threads",
                                             "onednn",
                                             "cuda_runtime",
                                             "cuda_driver",
                                             "nvml_driver",
                                             "cudnn",
                                             "cublas",
                                             "nccl",
                                             "compute_capability",
                                             "gpu_count",
                                             "gpu_power_limit_w",
                                             "gpu_max_sm_clock_mhz",
                                             "gpu_app_sm_clock_mhz",
                                             "gpu_app_mem_clock_mhz"};
  return k;
}

const std::vector<std::string>& configuration_keys() {
  static const std::vector<std::string> k = {"model",
                                             "image_size",
                                             "aux_logits",
                                             "precision",
                                             "layout",
                                             "gpus",
                                             "processes",
                                             "towers_per_process",
                                             "batch_size_per_gpu",
                                             "global_batch_size",
                                             "variable_update",
                                             "optimizer",
                                             "warmup_steps",
                                             "sync_overlap",
                                             "collective",
                                             "ps_device",
                                             "cuda_graph",
                                             "workspace_mb",
                                             "data",
                                             "data_threads",
                                             "prefetch",
                                             "tf32"};
  return k;
}

namespace {

double to_ms(double t, const std::string& unit) {
  if (unit == "ns") return t / 1e6;
  if (unit == "us") return t / 1e3;
  if (unit == "s") return t * 1e3;
  return t;  // ms
}

std::string context_string(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

std::vector<std::string> context_differences(const std::map<std::string, std::string>& a,
                                             const std::map<std::string, std::string>& b,
                                             const std::vector<std::string>& keys) {
  std::vector<std::string> d;
  for (const auto& k : keys) {
    auto ia = a.find(k), ib = b.find(k);
    if (ia != a.end() && ib != b.end() && ia->second != ib->second)
      d.push_back(fmt::format("{} {} vs {}", k, ia->second, ib->second));
  }
  return d;
}

namespace {

// Google Benchmark writes bare NaN, Infinity and -Infinity (not JSON) where an aggregate divides by
// zero, e.g. the cv of a counter that is 0 in every repetition (throttled on a GPU that never
// throttled): as null, outside strings, so that such a run reads.
std::string nan_as_null(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      out += ch;
      if (ch == '\\' && i + 1 < text.size())
        out += text[++i];
      else if (ch == '"')
        in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    bool replaced = false;
    for (const char* tok : {"-Infinity", "Infinity", "NaN"}) {
      const std::size_t n = std::char_traits<char>::length(tok);
      if (text.compare(i, n, tok) == 0) {
        out += "null";
        i += n - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += ch;
  }
  return out;
}

Run load_run_unchecked(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw CompareError(fmt::format("cannot read {}", path));
  json j;
  try {
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    j = json::parse(nan_as_null(text));
  } catch (const std::exception& e) {
    throw CompareError(fmt::format("{} is not JSON ({})", path, e.what()));
  }
  if (!j.is_object() || !j.contains("benchmarks") || !j["benchmarks"].is_array())
    throw CompareError(
        fmt::format("{} is not Google Benchmark's JSON (no \"benchmarks\" list); write one with "
                    "stepbench --json FILE",
                    path));
  Run r;
  r.source = path;
  if (j.contains("context") && j["context"].is_object())
    for (const auto& [k, v] : j["context"].items()) r.context[k] = context_string(v);
  for (const auto& b : j["benchmarks"]) {
    if (!b.is_object() || b.value("run_type", std::string("iteration")) != "iteration") continue;
    if (b.value("error_occurred", false) || !b.contains("real_time")) continue;
    const std::string key = benchmark_key(b.value("run_name", b.value("name", std::string())));
    if (key.empty()) continue;
    const double ms = to_ms(b["real_time"].get<double>(), b.value("time_unit", std::string("ns")));
    if (!std::isfinite(ms) || ms <= 0)
      throw CompareError(fmt::format("{}: {} has a time of {} ms; a repetition's time is positive", path, key, ms));
    auto [it, fresh] = r.benchmarks.try_emplace(key);
    if (fresh) r.order.push_back(key);
    Series& s = it->second;
    s.ms.push_back(ms);
    if (b.contains("throttled") && b["throttled"].is_number() && b["throttled"].get<double>() > 0) ++s.throttled;
    if (b.contains("layers") && b["layers"].is_number()) s.layers = b["layers"].get<double>();
    if (b.contains("label") && b["label"].is_string()) s.label = b["label"].get<std::string>();
    if (b.contains("ab_round") && b["ab_round"].is_number_integer()) s.round.push_back(b["ab_round"].get<int>());
  }
  if (auto it = r.context.find("ab_rounds"); it != r.context.end()) {
    try {
      r.rounds = std::stoi(it->second);
    } catch (const std::exception&) {
      throw CompareError(fmt::format("{}: ab_rounds is {}, not a number of rounds", path, it->second));
    }
    for (const auto& [key, s] : r.benchmarks)
      if (s.round.size() != s.ms.size() ||
          std::any_of(s.round.begin(), s.round.end(), [&](int k) { return k < 1 || k > r.rounds; }))
        throw CompareError(
            fmt::format("{}: {} has repetitions without a round 1..{} (\"ab_round\"); pool the rounds "
                        "with scripts/ab.sh",
                        path, key, r.rounds));
  }
  return r;
}

}  // namespace

Run load_run(const std::string& path) {
  try {
    return load_run_unchecked(path);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    throw CompareError(fmt::format("{} is not stepbench's JSON ({})", path, e.what()));
  }
}

std::string history_record(const Run& run, const std::string& time_utc) {
  json j;
  j["time"] = time_utc;
  auto it = run.context.find("revision");
  j["revision"] = it == run.context.end() ? "" : it->second;
  for (const auto* keys : {&fingerprint_keys(), &configuration_keys()}) {
    json part = json::object();
    for (const auto& k : *keys)
      if (auto c = run.context.find(k); c != run.context.end()) part[k] = c->second;
    j[keys == &fingerprint_keys() ? "fingerprint" : "configuration"] = part;
  }
  json b = json::object();
  for (const auto& key : run.order) {
    const Series& s = run.benchmarks.at(key);
    b[key] = {{"ms", s.ms},
              {"median_ms", median(s.ms)},
              {"spread", relative_spread(s.ms)},
              {"throttled", s.throttled},
              {"layers", s.layers},
              {"label", s.label}};
  }
  j["benchmarks"] = b;
  return j.dump();
}

namespace {

Run load_history_unchecked(const std::string& path, const Run& head, int last) {
  std::ifstream f(path);
  if (!f) throw CompareError(fmt::format("cannot read the history {}", path));
  // "unknown": built outside a git checkout, no revision to tell runs apart
  std::string head_rev = head.context.count("revision") ? head.context.at("revision") : "";
  if (head_rev == "unknown") head_rev.clear();
  std::vector<json> matching;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json rec;
    try {
      rec = json::parse(line);
    } catch (const std::exception& e) {
      throw CompareError(fmt::format("{} line {} is not JSON ({})", path, n, e.what()));
    }
    if (!rec.is_object()) throw CompareError(fmt::format("{} line {} is not a stepbench --history record", path, n));
    std::map<std::string, std::string> ctx;
    for (const char* part : {"fingerprint", "configuration"})
      if (rec.contains(part) && rec[part].is_object())
        for (const auto& [k, v] : rec[part].items()) ctx[k] = context_string(v);
    if (!context_differences(ctx, head.context, fingerprint_keys()).empty()) continue;
    if (!context_differences(ctx, head.context, configuration_keys()).empty()) continue;
    if (!head_rev.empty() && rec.value("revision", std::string()) == head_rev) continue;
    rec["context"] = ctx;
    matching.push_back(std::move(rec));
  }
  Run r;
  r.history_last = static_cast<std::size_t>(last);
  // every matching run's median and repetitions per benchmark, oldest first: the series behind the
  // noise and the change points, and the base window (the runs since the last change point)
  for (std::size_t i = 0; i < matching.size(); ++i) {
    const json& rec = matching[i];
    r.history.push_back({rec.value("revision", std::string("?")), rec.value("time", std::string())});
    r.context = rec["context"].get<std::map<std::string, std::string>>();
    if (!rec.contains("benchmarks") || !rec["benchmarks"].is_object()) continue;
    for (const auto& [key, b] : rec["benchmarks"].items()) {
      auto [it, fresh] = r.benchmarks.try_emplace(key);
      if (fresh) r.order.push_back(key);
      Series& s = it->second;
      s.run_medians.resize(matching.size(), NAN);
      s.run_ms.resize(matching.size());
      s.run_throttled.resize(matching.size(), 0);
      if (b.contains("median_ms") && b["median_ms"].is_number()) s.run_medians[i] = b["median_ms"].get<double>();
      for (const auto& v : b.value("ms", json::array())) s.run_ms[i].push_back(v.get<double>());
      s.run_throttled[i] = b.value("throttled", 0);
      s.layers = b.value("layers", 1.0);
      s.label = b.value("label", std::string());
    }
  }
  r.source = matching.empty() ? fmt::format("history {} (no earlier run on this machine and configuration)", path)
                              : fmt::format("history {} ({} earlier run{} on this machine and configuration)", path,
                                            matching.size(), matching.size() == 1 ? "" : "s");
  return r;
}

}  // namespace

Run load_history(const std::string& path, const Run& head, int last) {
  try {
    return load_history_unchecked(path, head, last);
  } catch (const nlohmann::json::exception& e) {
    throw CompareError(fmt::format("{} is not a stepbench --history file ({})", path, e.what()));
  }
}

}  // namespace stepbench::compare
