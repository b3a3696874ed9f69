// The convolution plan cache: which algorithm a library's search (cudnnFind*) chose for one
// convolution direction, keyed by everything that decides that choice. One cache serves every tower
// of a process and the per-layer benchmarks (so they all run the same algorithm, searched once);
// load()/save() keep it in a file between runs (--plan-cache FILE). The machine's part of the key
// (GPU model, driver, library version) is the backend's: a file carried to another machine or kept
// across a driver update holds entries that are simply never looked up there.
#pragma once
#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "backend/backend.hpp"
#include "tensor/error.hpp"

namespace stepbench {

enum class ConvDirection { forward, backward_data, backward_filter };
const char* to_string(ConvDirection d);

// What one search chose: the library's algorithm and math-type numbers, the workspace it needs, and
// the time the search measured (for the curious; not used to decide).
struct ConvPlan {
  int algo = 0;
  int math = 0;
  std::size_t workspace = 0;
  double ms = 0;
  bool operator==(const ConvPlan&) const = default;
};

// The key of one direction of one convolution: machine (the backend's fingerprint: GPU model and
// compute capability, driver, library version), direction, input and output descriptors (shape,
// strides, dtype, layout) as the library sees them, filter size, padding and stride, the math the
// search may use (e.g. "fma" or "tensor_op"), and the workspace limit. Two convolutions with the
// same key get the same plan.
std::string conv_plan_key(const std::string& machine, ConvDirection d, const TensorDesc& x, const TensorDesc& y,
                          const ConvParams& p, const std::string& math, std::size_t workspace_limit);

class ConvPlanCache {
 public:
  // The plan for key, or nothing (counted as reused when found).
  std::optional<ConvPlan> find(const std::string& key);
  // Records a plan just searched for key (counted as searched) and returns the plan the cache holds
  // for key: the first one recorded, so that towers searching at once still agree.
  ConvPlan insert(const std::string& key, const ConvPlan& plan);
  // Records a plan searched again because the one held for key did not run here (counted as searched).
  void replace(const std::string& key, const ConvPlan& plan);

  // Reads a file written by save(); a missing file is an empty cache. Throws UsageError naming the
  // file when it cannot be read or is not a plan cache (or one of a format this build does not read,
  // or has an entry whose numbers are out of range).
  void load(const std::string& path);
  // Writes every entry (those of other machines too) to a temporary file renamed over path. Throws
  // Error when the file cannot be written.
  void save(const std::string& path) const;

  std::size_t size() const;
  std::size_t searched() const { return searched_; }
  std::size_t reused() const { return reused_; }
  std::size_t loaded() const { return loaded_; }
  // The file load() read ("" when none), for reports.
  std::string path() const;

 private:
  mutable std::mutex m_;
  std::map<std::string, ConvPlan> plans_;
  std::string path_;
  std::atomic<std::size_t> searched_{0}, reused_{0}, loaded_{0};
};

}  // namespace stepbench
