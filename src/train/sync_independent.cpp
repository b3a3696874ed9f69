// independent: nothing moves; every tower trains on its own and updates its own variables.
#include "train/sync.hpp"

namespace stepbench {
namespace {

class IndependentSync final : public GradientSync {
 public:
  explicit IndependentSync(const SyncTowers& t) : t_(t) {}
  std::string name() const override { return "none"; }
  std::size_t bytes() const override { return 0; }
  double bus_factor() const override { return 0.0; }
  void sync_bucket(std::size_t) override {}  // never called: nothing to sync
  void update() override { t_.update_every_tower(); }
  void synchronize() const override { t_.synchronize_every_tower(); }

 private:
  SyncTowers t_;
};

}  // namespace

std::unique_ptr<GradientSync> make_independent_sync(const SyncTowers& t) {
  return std::make_unique<IndependentSync>(t);
}

}  // namespace stepbench
