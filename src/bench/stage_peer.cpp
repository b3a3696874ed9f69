// The run's peer stage (stages.hpp): --peer runs the same phases, precision and settings in PyTorch
// (bench/torch_peer.py) after stepbench's own, for ratios in the summary; with --layer-times on the
// CPU also its profiled layers, set beside stepbench's.
#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "bench/peer_layers.hpp"
#include "bench/stages.hpp"

namespace stepbench {

PeerResult compare_with_peer(Run& run, const Timings& t, const Probes& p) {
  if (run.peer_python.empty()) return {};
  run.progress.clear();  // the peer says on stderr what it runs
  const BenchConfig& c = run.c;
  Backend& be = run.towers->backend(0);
  const auto v = be.versions();
  const auto th = v.find("omp_threads");
  // per layer on the CPU only: on a GPU PyTorch's CPU profiler would time the launches
  const bool peer_layers = p.layer_times && be.name() == "cpu";
  PeerResult peer = run_peer(c, run.peer_dirs, run.peer_python, th == v.end() ? 0 : std::atoi(th->second.c_str()),
                             peer_layers ? std::max(c.repetitions, 3) : 0);
  if (peer_layers && !peer.layers.empty()) {
    try {
      add_json_section(run, t, "peer_layer_times", peer_layers_json(match_peer_layers(*p.layer_times, peer), peer));
    } catch (const Error& e) {
      std::cerr << "stepbench: " << e.what() << "\n";
    }
  }
  return peer;
}

}  // namespace stepbench
