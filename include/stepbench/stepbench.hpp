// stepbench as a library: build a model, plan it, time its training step, read a run file.
//
//   #include <stepbench/stepbench.hpp>
//   stepbench::ModelSpec spec;                // Inception-v3, fp32, NCHW, batch 8 on the cpu
//   spec.backend = "cuda";
//   stepbench::Model m(spec);                 // build: layers and parameters
//   m.plan();                                 // plan: every buffer, op and algorithm
//   stepbench::StepTimes t = m.time_step();   // t.forward_ms, t.backward_ms, t.update_ms, t.step_ms
//
// CMake: find_package(stepbench) and target_link_libraries(app PRIVATE stepbench::stepbench), or
// add_subdirectory(stepbench) with the same target. Errors are exceptions derived from
// std::runtime_error whose message says what to change. Nothing here reads the environment or
// keeps global state; a Model is used from one thread at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace stepbench {

// The library's version ("0.1.0") and the backends this build has ({"cpu"} or {"cpu", "cuda"}).
std::string version();
std::vector<std::string> backends();

// What to build. The names are the command line's (--model, --backend, --precision, --format).
struct ModelSpec {
  std::string model = "inception_v3";  // one of `stepbench --list-models`: inception_v3, resnet50, ...
  std::string backend = "cpu";         // cpu, cuda, or auto (cuda when a GPU is visible)
  std::int64_t batch = 8;              // images per step
  std::int64_t image_size = 0;         // height and width; 0: the model's training size (299, 224, ...)
  std::string precision = "fp32";      // fp32, tf32 (cuda), bf16 or fp16
  std::string layout = "nchw";         // nchw or nhwc
  bool aux_logits = true;              // Inception's auxiliary head (training only)
};

// One training step's parts: medians over the timed steps, in milliseconds, on the device (events
// on its stream; on the cpu backend the steady clock around the work).
struct StepTimes {
  double forward_ms = 0, backward_ms = 0, update_ms = 0, step_ms = 0;
  int steps = 0;            // how many steps were timed
  std::int64_t images = 0;  // per step
  double images_per_s() const { return step_ms > 0 ? 1000.0 * static_cast<double>(images) / step_ms : 0.0; }
};

// A network on one device: built (layers and parameters), then planned (every buffer allocated,
// every op and algorithm chosen), then stepped.
class Model {
 public:
  explicit Model(const ModelSpec& spec);
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelSpec& spec() const;
  std::string backend() const;  // what runs it: "cpu" or "cuda" (auto resolved)
  std::string device() const;   // e.g. "NVIDIA H200", or the CPU's name and threads
  std::int64_t parameters() const;
  double forward_gflop_per_image() const;  // 2 x multiply-adds

  // Allocates every buffer and makes every op; returns the device memory the model holds, in bytes.
  // Throws when the batch does not fit (the message has a batch that does).
  std::size_t plan();
  bool planned() const;

  // `warmup` untimed training steps on a fixed synthetic batch (never fewer than one), then
  // `steps` timed ones: forward (training mode), backward, the optimizer's update. Plans first if
  // plan() was not called.
  StepTimes time_step(int warmup = 2, int steps = 5);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A run file written by `stepbench --json` (Google Benchmark's JSON with stepbench's context), or
// a round pooled by scripts/ab.sh.
struct RunFile {
  struct Benchmark {
    std::string name;        // without Google Benchmark's "/repeats:N" and "/manual_time"
    std::vector<double> ms;  // one value per repetition, milliseconds
    double median_ms = 0;
  };
  std::map<std::string, std::string> context;  // model, precision, device, versions, ...
  std::vector<Benchmark> benchmarks;           // in the file's order
};
// Throws std::runtime_error naming the file when it cannot be read or is not a run file.
RunFile read_run_file(const std::string& path);

}  // namespace stepbench
