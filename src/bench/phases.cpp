#include "bench/phases.hpp"

#include <array>

namespace stepbench {
namespace {

const std::array<PhaseDef, 6> kPhases{{
    {Phase::forward, 2, [](Towers& t, RegionTimer&) { t.forward_inference(); }},
    {Phase::forward_train, 2, [](Towers& t, RegionTimer&) { t.forward_train(); }},
    {Phase::forward_backward, 3,
     [](Towers& t, RegionTimer& rt) {
       t.forward_train();
       rt.mark(1);
       t.backward();
     }},
    {Phase::step, 5,
     [](Towers& t, RegionTimer& rt) {
       t.forward_train();
       rt.mark(1);
       t.backward(/*start_sync=*/true);  // buckets sync as backward produces them (unless --no-overlap)
       rt.mark(2);
       t.grad_sync();
       rt.mark(3);
       t.update();
     }},
    {Phase::grad_sync, 2, [](Towers& t, RegionTimer&) { t.grad_sync(); }},
    {Phase::update, 2, [](Towers& t, RegionTimer&) { t.update(); }},
}};

}  // namespace

std::span<const PhaseDef> model_phases() { return kPhases; }

const PhaseDef* find_phase(Phase p) {
  for (const auto& d : kPhases)
    if (d.phase == p) return &d;
  return nullptr;
}

}  // namespace stepbench
