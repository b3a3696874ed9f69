// CUDA Graph capture and replay of the step or the forward, and waiting for every tower (with the
// sync timeout when a collective runs asynchronously).
#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "tensor/error.hpp"
#include "train/tower_parts.hpp"

namespace stepbench {

void Towers::capture(bool step) {
  if (opt_.backend != BackendKind::cuda)
    throw UsageError("--cuda-graph needs the cuda backend; drop it or use --backend cuda");
  if (size() != 1)
    throw UsageError(
        fmt::format("--cuda-graph captures one GPU's stream: use one GPU per process (--gpus 1, and "
                    "mpirun -np {} for {} GPUs)",
                    size(), size()));
  if (server_)
    throw UsageError("--cuda-graph cannot capture the host parameter server's CPU work; use --ps-device device");
  if (!staging_.empty())
    throw UsageError("--cuda-graph replays the synthetic batch on the device; use --data synthetic with it");
  Tower& t = *towers_[0];
  auto& s = t.be->default_stream();
  synchronize();
  t.be->begin_capture(s);
  try {
    if (step)
      this->step();
    else
      forward_inference();
  } catch (...) {
    try {
      t.be->end_capture(s);  // leave the stream usable; the first error is the one to report
    } catch (...) {
    }
    throw;
  }
  (step ? graph_step_ : graph_forward_) = t.be->end_capture(s);
}

void Towers::replay(bool step) {
  auto& g = step ? graph_step_ : graph_forward_;
  SB_CHECK(g != nullptr, "capture() before replay()");
  g->replay(stream(0));
}

void Towers::synchronize() const {
  if (!coll_ || !coll_->asynchronous()) {
    for (auto& t : towers_) t->be->synchronize(t->be->default_stream());
    return;
  }
  // Poll, as nccl-tests does: a hung collective must end the run, not block it in the driver.
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& t : towers_) {
    while (!t->be->query(t->be->default_stream())) {
      coll_->check();
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (opt_.sync_timeout_s > 0 && waited > opt_.sync_timeout_s) {
        coll_->abort();
        throw SyncError(fmt::format(
            "the GPUs' work with the gradient sync ({}) did not complete within {:g} s on process {} of {}: a peer "
            "failed or stalled. If the step is legitimately that slow, raise --sync-timeout-s (0 waits forever)",
            coll_->name(), opt_.sync_timeout_s, rank_, processes_));
      }
      std::this_thread::yield();
    }
  }
  coll_->check();
}

}  // namespace stepbench
