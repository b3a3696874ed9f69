#include "bench/peer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

namespace stepbench {
namespace {

// `s` as one word for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// Runs `cmd` through /bin/sh; its stdout, and its exit status (-1: did not start, 128+N: signal N).
std::string capture(const std::string& cmd, int* status) {
  std::string text;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    *status = -1;
    return text;
  }
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
  const int rc = pclose(f);
  *status = rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  return text;
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const auto nl = t.find_last_of('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

}  // namespace

std::string find_peer_python(const std::vector<std::string>& candidates, bool need_cuda, bool need_compile,
                             std::string* why) {
  // exit 3: no torch or torchvision; 4: torch without a usable GPU; 5: torch without torch.compile
  const std::string probe = fmt::format(
      "try:\n"
      "    import torch, torchvision\n"
      "except Exception as e:\n"
      "    print(f\"cannot import torch and torchvision ({{type(e).__name__}}: {{e}})\"); raise SystemExit(3)\n"
      "if {} and not torch.cuda.is_available():\n"
      "    print(f\"torch {{torch.__version__}} \" + (\"is built without CUDA\" if torch.version.cuda is None\n"
      "          else \"is built with CUDA \" + torch.version.cuda + \" but sees no GPU\")); raise SystemExit(4)\n"
      "if {} and not hasattr(torch, \"compile\"):\n"
      "    print(f\"torch {{torch.__version__}} has no torch.compile (2.0 or later has)\"); raise SystemExit(5)\n"
      "print(f\"torch {{torch.__version__}}\")\n",
      need_cuda ? "True" : "False", need_compile ? "True" : "False");
  std::string reasons;
  for (const auto& py : candidates) {
    if (py.empty()) continue;
    int st = 0;
    const std::string out = last_line(capture(shell_quote(py) + " -c " + shell_quote(probe) + " 2>/dev/null", &st));
    if (st == 0) return py;
    reasons += fmt::format("  {}: {}\n", py,
                           st == 127            ? "not found"
                           : st >= 3 && st <= 5 ? out
                           : st == -1           ? "could not be started"
                                                : fmt::format("exited with status {} {}", st, out));
  }
  if (why) *why = reasons;
  return "";
}

double benchmark_min_time(const std::vector<std::string>& benchmark_args) {
  double t = 0.5;  // Google Benchmark 1.7's default
  const std::string key = "--benchmark_min_time=";
  for (const auto& a : benchmark_args) {
    if (a.rfind(key, 0) != 0) continue;
    std::string v = a.substr(key.size());
    if (!v.empty() && v.back() == 's') v.pop_back();
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (end && *end == '\0' && !v.empty() && x >= 0) t = x;
  }
  return t;
}

std::string choose_peer_python(const BenchConfig& c) {
  const bool cuda = c.run.backend == BackendKind::cuda, compile = c.peer == PeerKind::pytorch_compile;
  std::string why;
  std::string py = find_peer_python(c.peer_pythons, cuda, compile, &why);
  if (py.empty())
    std::cerr << fmt::format(
        "stepbench: --peer {}: none of these Pythons has torch and torchvision{}{}:\n{}"
        "stepbench: point --peer-python at one that has ({})\n",
        to_string(c.peer), cuda ? " with CUDA and a visible GPU" : "", compile ? " and torch.compile" : "", why,
        compile ? "PyTorch 2.0 or later, e.g. the python of a virtual environment with `pip install torch "
                  "torchvision`"
        : cuda  ? "e.g. the python of a virtual environment with `pip install torch torchvision` from "
                  "download.pytorch.org/whl/cuXYZ"
                : "e.g. Debian's /usr/bin/python3 with python3-torch and python3-torchvision");
  return py;
}

PeerResult run_peer(const BenchConfig& c, const std::vector<std::string>& script_dirs, const std::string& py,
                    int threads, int layer_steps) {
  PeerResult out;
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
  // the phases the peer has, of those stepbench times (all when --phases is not given)
  std::vector<std::string> phases;
  for (const char* p : {"forward", "forward_train", "forward_backward", "step"}) {
    const bool wanted = c.phases.empty() || std::any_of(c.phases.begin(), c.phases.end(),
                                                        [&](Phase q) { return std::string(to_string(q)) == p; });
    if (wanted) phases.emplace_back(p);
  }
  if (phases.empty()) {
    std::cerr << "stepbench: the peer times forward, forward_train, forward_backward and step; --phases has none of "
                 "them, no ratios\n";
    return out;
  }
  const std::string cmd = fmt::format(
      "{} {} --model {} --batch-size {} --image-size {} --format {} --aux-logits {} --dropout {} --device {} "
      "--warmup {} --repetitions {} --precision {} --min-time {} --phases {}{}{}{}",
      shell_quote(py), shell_quote(script), to_string(r.model), r.batch_per_tower, r.model_options.image_size,
      to_string(r.layout), r.model_options.aux_logits ? "on" : "off", r.model_options.dropout, to_string(r.backend),
      c.warmup, c.repetitions, to_string(r.precision), benchmark_min_time(c.benchmark_args),
      fmt::format("{}", fmt::join(phases, ",")), threads > 0 ? fmt::format(" --threads {}", threads) : "",
      c.peer == PeerKind::pytorch_compile ? " --compile" : "",
      layer_steps > 0 ? fmt::format(" --layer-times {}", layer_steps) : "");
  std::cerr << "stepbench: timing the peer: " << cmd << "\n";
  int st = 0;
  const std::string text = capture(cmd, &st);
  if (st != 0) {
    std::cerr << fmt::format("stepbench: the peer exited with status {}{}; no ratios\n", st,
                             st == -1   ? " (did not start)"
                             : st == 77 ? " (torch or torchvision missing)"
                                        : "");
    return out;
  }
  try {
    const auto j = nlohmann::json::parse(last_line(text));  // the peer's last line is one JSON object
    for (const auto& [k, v] : j.items())
      if (v.is_number() && k != "threads" && k != "cudnn") out.ms[k] = v.get<double>();
    if (j.contains("host_ms"))
      for (const auto& [k, v] : j["host_ms"].items()) out.host_ms[k] = v.get<double>();
    if (j.contains("layers")) {
      for (const auto& [k, v] : j["layers"].items())
        out.layers[k] = {v.value("forward_ms", 0.0), v.value("backward_ms", 0.0)};
      out.layer_steps = layer_steps;
    }
    if (j.contains("memory") && j["memory"].is_object()) {
      const auto& m = j["memory"];
      out.baseline_rss = m.value("baseline_rss_bytes", std::size_t{0});
      out.peak_rss = m.value("peak_rss_bytes", std::size_t{0});
      out.cuda_max_allocated = m.value("cuda_max_allocated_bytes", std::size_t{0});
    }
    out.timing = j.value("timing", std::string("host"));
    out.settings = j.value("settings", std::string("not reported"));
    out.torch = j.value("torch", std::string("?"));
    out.python = py;
    std::cerr << "stepbench: peer: PyTorch " << out.torch << " (" << py << "), " << j.value("threads", 0)
              << " threads\n";
  } catch (const std::exception& e) {
    std::cerr << "stepbench: the peer's output was not JSON (" << e.what() << ")\n";
    out = PeerResult{};
  }
  return out;
}

}  // namespace stepbench
