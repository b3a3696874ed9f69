// replicated: every bucket is all-reduced (averaged) onto every tower, and every tower updates its
// own copy of the variables (identical results).
#include "train/sync.hpp"

namespace stepbench {
namespace {

class ReplicatedSync final : public CollectiveSync {
 public:
  using CollectiveSync::CollectiveSync;
  double bus_factor() const override {
    if (bytes() == 0) return 0.0;
    const double n = t_.global_size();
    return 2.0 * (n - 1) / n;  // allreduce
  }
  void update() override { t_.update_every_tower(); }

 private:
  void average(std::size_t off, std::size_t count) override { coll_->allreduce_average(t_.grads, off, count); }
};

}  // namespace

std::unique_ptr<GradientSync> make_replicated_sync(const SyncTowers& t, std::unique_ptr<Collective> coll) {
  return std::make_unique<ReplicatedSync>(t, std::move(coll));
}

}  // namespace stepbench
