// CUDA Graph capture and replay of the step or the forward, and waiting for every tower (the
// gradient sync's wait: with the sync timeout when its collective runs asynchronously).
#include <fmt/format.h>

#include "tensor/error.hpp"
#include "train/sync.hpp"
#include "train/tower_parts.hpp"

namespace stepbench {

void Towers::capture(bool step) {
  if (opt_.backend != BackendKind::cuda)
    throw UsageError("--cuda-graph needs the cuda backend; drop it or use --backend cuda");
  if (size() != 1)
    throw UsageError(
        fmt::format("--cuda-graph captures one GPU's stream: use one GPU per process (--gpus 1, and "
                    "stepbench launch --nproc {} or mpirun -np {} for {} GPUs)",
                    size(), size(), size()));
  sync_->check_capturable();
  if (!staging_.empty())
    throw UsageError("--cuda-graph replays the synthetic batch on the device; use --data synthetic with it");
  Replica& t = *towers_[0];
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
  sync_->synchronize();
  for (const auto& t : towers_) t->g->check_after_sync();  // a bad label the device flagged in the step
}

}  // namespace stepbench
