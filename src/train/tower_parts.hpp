// Inside the towers: what each tower owns, the host parameter server and the input staging buffers
// (towers.cpp, staging.cpp, capture.cpp). Not for use outside src/train.
#pragma once
#include <memory>
#include <vector>

#include "train/towers.hpp"
#include "train/trainer.hpp"

namespace stepbench {

struct Towers::Tower {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Graph> g;
  std::unique_ptr<Trainer> tr;
  std::unique_ptr<Stream> comm;               // the gradient sync's stream
  std::vector<std::unique_ptr<Event>> ready;  // per bucket: backward has produced it (compute stream)
  std::unique_ptr<Event> computed, synced;    // compute -> comm and comm -> compute ordering
  std::size_t recorded = 0;                   // ready events recorded this step
};

// The parameter server in host memory (ps_on_host): the variables, their summed gradients and the
// optimizer state, updated by the cpu backend; pinned where the towers' backend pins.
struct Towers::HostServer {
  std::unique_ptr<Backend> cpu = make_backend(BackendKind::cpu);
  HostBuffer params, grads;
  std::vector<HostBuffer> tmp;  // per tower but the first: one bucket of its gradients
  std::unique_ptr<OptimizerState> opt;
};

struct Towers::Staging {
  Buffer images[2], labels[2];
  Buffer narrow[2];  // bf16/fp16 models: the fp32 images cast on the copy stream, as tf_cnn_benchmarks does
  std::unique_ptr<Stream> copy;
  std::unique_ptr<Event> copied[2], consumed[2];
  bool consumed_recorded[2] = {false, false};
  int cur = -1;  // the buffer steps read; -1: the graph's own
};

}  // namespace stepbench
