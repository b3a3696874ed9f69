// Inside the towers: what each tower owns and the input staging buffers (towers.cpp, staging.cpp,
// capture.cpp, the gradient syncs sync_*.cpp). Not for use outside src/train.
#pragma once
#include <memory>
#include <vector>

#include "train/towers.hpp"
#include "train/trainer.hpp"

namespace stepbench {

// One tower: its backend, graph and trainer, and the gradient sync's stream and events.
struct Replica {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Graph> g;
  std::unique_ptr<Trainer> tr;
  std::unique_ptr<Stream> comm;               // the gradient sync's stream
  std::vector<std::unique_ptr<Event>> ready;  // per bucket: backward has produced it (compute stream)
  std::unique_ptr<Event> computed, synced;    // compute -> comm and comm -> compute ordering
  std::size_t recorded = 0;                   // ready events recorded this step
  // Towers::set_sync_timing: per bucket, timing events beside `ready` (compute stream) and around its
  // sync (communication stream).
  std::vector<std::unique_ptr<Event>> timed_ready, sync_begin, sync_end;
  // Towers::set_step_timing: the step's start, forward's end, backward's start and end, and where
  // the sync released the compute stream (timeline.cpp).
  std::unique_ptr<Event> step_begin, forward_end, backward_begin, backward_end, released;
  double delay_ms = 0;  // --slow-tower: held at the start of every backward

  Stream& compute() const { return be->default_stream(); }
  // The communication stream waits for everything enqueued on the compute stream so far.
  void comm_after_compute() const {
    be->record(*computed, compute());
    be->wait(*comm, *computed);
  }
  // The compute stream waits for everything enqueued on the communication stream so far.
  void compute_after_comm() const {
    be->record(*synced, *comm);
    be->wait(compute(), *synced);
  }
};

struct Towers::Staging {
  Buffer images[2], labels[2];
  Buffer narrow[2];  // bf16/fp16 models: the fp32 images cast on the copy stream, as tf_cnn_benchmarks does
  std::unique_ptr<Stream> copy;
  std::unique_ptr<Event> copied[2], consumed[2];
  bool consumed_recorded[2] = {false, false};
  int cur = -1;  // the buffer steps read; -1: the graph's own
  // set_staging_timing: timing events around the last stage()'s work on the copy stream
  std::unique_ptr<Event> begin, end;
  bool timed = false;
};

}  // namespace stepbench
