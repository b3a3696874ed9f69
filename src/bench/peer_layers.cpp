// stepbench's layer times beside the peer's profiler's (see peer_layers.hpp).
#include "bench/peer_layers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>

namespace stepbench {
namespace {

std::string kind_name(const std::string& kind) {
  if (kind == "conv_bn_relu") return "conv + BN + ReLU";
  if (kind == "conv_bn") return "conv + BN";
  if (kind == "add_relu") return "residual add + ReLU";
  if (kind == "pool") return "pooling";
  if (kind == "linear") return "fully connected";
  return kind;
}
std::string peer_ratio(double a, double b) { return b > 0 ? fmt::format("{:.2f}", a / b) : "-"; }

}  // namespace

std::vector<PeerLayer> match_peer_layers(const LayerTimes& lt, const PeerResult& peer) {
  std::vector<PeerLayer> rows;
  std::map<int, std::size_t> at;  // layer index -> row
  for (const auto& r : lt.rows) {
    if (r.layer < 0) continue;
    const auto p = peer.layers.find(r.label);
    if (p == peer.layers.end()) continue;
    auto [it, fresh] = at.try_emplace(r.layer, rows.size());
    if (fresh) rows.push_back({r.label, r.kind, 0, 0, p->second.forward_ms, p->second.backward_ms});
    (r.pass == "forward" ? rows[it->second].forward_ms : rows[it->second].backward_ms) += r.ms;
  }
  return rows;
}

nlohmann::json peer_layers_json(const std::vector<PeerLayer>& rows, const PeerResult& peer) {
  auto layers = nlohmann::json::array();
  for (const auto& r : rows)
    layers.push_back({{"layer", r.layer},
                      {"kind", r.kind},
                      {"forward_ms", r.forward_ms},
                      {"backward_ms", r.backward_ms},
                      {"peer_forward_ms", r.peer_forward_ms},
                      {"peer_backward_ms", r.peer_backward_ms}});
  return {{"peer", "PyTorch " + peer.torch},
          {"peer_clock", "torch.profiler, CPU ops' host time, medians of the profiled steps"},
          {"peer_steps", peer.layer_steps},
          {"layers", layers}};
}

void print_peer_layers(const std::vector<PeerLayer>& rows, const PeerResult& peer, int top) {
  if (rows.empty()) {
    std::cout << "\nlayers beside PyTorch's: the peer named none of stepbench's layers\n";
    return;
  }
  std::cout << fmt::format(
      "\nlayers beside PyTorch {}'s profiler (bench/torch_peer.py --layer-times: medians of {} profiled steps; its "
      "times include the profiler's cost per op); stepbench/PT < 1: stepbench is faster\n",
      peer.torch, peer.layer_steps);
  const auto header = [](const char* first) {
    return fmt::format("  {:<32} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>9}\n", first, "fwd ms", "PT fwd", "ratio",
                       "bwd ms", "PT bwd", "ratio", "gap ms");
  };
  const auto line = [](const std::string& name, const PeerLayer& s) {
    return fmt::format("  {:<32} {:>9.3f} {:>9.3f} {:>6} {:>9.3f} {:>9.3f} {:>6} {:>+9.3f}\n", name, s.forward_ms,
                       s.peer_forward_ms, peer_ratio(s.forward_ms, s.peer_forward_ms), s.backward_ms,
                       s.peer_backward_ms, peer_ratio(s.backward_ms, s.peer_backward_ms), s.gap_ms());
  };
  std::vector<std::string> order;
  std::map<std::string, PeerLayer> kinds;
  PeerLayer all;
  for (const auto& r : rows) {
    const std::string k = kind_name(r.kind);
    if (!kinds.count(k)) order.push_back(k);
    for (PeerLayer* s : {&kinds[k], &all}) {
      s->forward_ms += r.forward_ms;
      s->backward_ms += r.backward_ms;
      s->peer_forward_ms += r.peer_forward_ms;
      s->peer_backward_ms += r.peer_backward_ms;
    }
  }
  std::cout << header("by kind of work");
  for (const auto& k : order) std::cout << line(k, kinds[k]);
  std::cout << line(fmt::format("all {} layers", rows.size()), all);
  std::vector<PeerLayer> by_gap = rows;
  std::stable_sort(by_gap.begin(), by_gap.end(), [](const auto& a, const auto& b) { return a.gap_ms() > b.gap_ms(); });
  std::cout << header(fmt::format("top {} layers by gap", std::min<std::size_t>(top, by_gap.size())).c_str());
  for (std::size_t i = 0; i < by_gap.size() && i < static_cast<std::size_t>(top); ++i)
    std::cout << line(by_gap[i].layer, by_gap[i]);
}

}  // namespace stepbench
