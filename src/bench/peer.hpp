// --peer pytorch: the same phases timed by bench/torch_peer.py after stepbench, for ratios.
#pragma once
#include <map>
#include <string>

#include "bench/config.hpp"

namespace stepbench {

// The peer's medians by phase (ms), or empty with the reason printed on stderr. `script_dirs`: the
// folders to look for bench/torch_peer.py in, first match wins. `settings`, when given, receives
// the numerics settings the peer ran with (TF32 flags, autocast, loss scaling, threads).
std::map<std::string, double> run_peer(const BenchConfig& c, const std::vector<std::string>& script_dirs,
                                       std::string* settings = nullptr);

}  // namespace stepbench
