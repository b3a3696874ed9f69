#include "bench/peer.hpp"

#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

namespace stepbench {

// The peer's medians by phase (ms), or empty with the reason printed.
std::map<std::string, double> run_peer(const BenchConfig& c, const std::vector<std::string>& script_dirs,
                                       std::string* settings) {
  std::map<std::string, double> out;
  if (c.peer == PeerKind::none) return out;
  std::string script;
  for (const auto& d : script_dirs) {
    std::error_code ec;
    if (std::filesystem::exists(d + "/bench/torch_peer.py", ec)) {
      script = d + "/bench/torch_peer.py";
      break;
    }
  }
  if (script.empty()) {
    std::cerr << "stepbench: bench/torch_peer.py not found beside the binary or in the source tree; no ratios\n";
    return out;
  }
  const auto& r = c.run;
  const std::string cmd = fmt::format(
      "'{}' '{}' --model {} --batch-size {} --image-size {} --format {} --aux-logits {} --device {} --warmup {} "
      "--repetitions {} --precision {}",
      c.peer_python, script, to_string(r.model), r.batch_per_tower, r.model_options.image_size, to_string(r.layout),
      r.model_options.aux_logits ? "on" : "off", to_string(r.backend), c.warmup, c.repetitions, to_string(r.precision));
  std::cerr << "stepbench: timing the peer: " << cmd << "\n";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    std::cerr << "stepbench: the peer did not start\n";
    return out;
  }
  std::string text;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
  const int rc = pclose(f);
  if (rc != 0) {
    std::cerr << fmt::format("stepbench: the peer exited with status {} (77: torch missing); no ratios\n",
                             WIFEXITED(rc) ? WEXITSTATUS(rc) : rc);
    return out;
  }
  try {
    // the peer prints one JSON object on its last line
    const auto nl = text.find_last_of('\n', text.size() >= 2 ? text.size() - 2 : 0);
    const auto j = nlohmann::json::parse(nl == std::string::npos ? text : text.substr(nl + 1));
    for (const auto& [k, v] : j.items())
      if (v.is_number() && k != "threads") out[k] = v.get<double>();
    if (settings) *settings = j.value("settings", std::string("not reported"));
    std::cerr << "stepbench: peer: PyTorch " << j.value("torch", std::string("?")) << ", " << j.value("threads", 0)
              << " threads\n";
  } catch (const std::exception& e) {
    std::cerr << "stepbench: the peer's output was not JSON (" << e.what() << ")\n";
  }
  return out;
}

}  // namespace stepbench
