// --layer-times with --peer on the CPU: stepbench's layer times beside PyTorch's profiler's for the
// same layers (bench/torch_peer.py --layer-times), so the remaining gap is named layer by layer.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "bench/layer_times.hpp"
#include "bench/peer.hpp"

namespace stepbench {

// One layer on both sides: stepbench's medians (the sum of its pieces per pass) and the peer's.
struct PeerLayer {
  std::string layer, kind;  // stepbench's label and kind of work
  double forward_ms = 0, backward_ms = 0, peer_forward_ms = 0, peer_backward_ms = 0;
  double gap_ms() const { return forward_ms + backward_ms - peer_forward_ms - peer_backward_ms; }
};
// The layers both sides name, in stepbench's execution order; layers only one side has are left out
// (the losses: PyTorch's cross entropy runs outside any module).
std::vector<PeerLayer> match_peer_layers(const LayerTimes& lt, const PeerResult& peer);
nlohmann::json peer_layers_json(const std::vector<PeerLayer>& rows, const PeerResult& peer);
// The summary's section: per kind of work, then the `top` layers by gap (stepbench's time minus
// PyTorch's, forward and backward together).
void print_peer_layers(const std::vector<PeerLayer>& rows, const PeerResult& peer, int top);

}  // namespace stepbench
