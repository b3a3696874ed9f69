#include <cmath>
#include <cstdint>
#include <vector>

#include "graph/graph.hpp"

namespace stepbench {
namespace {
// A small portable generator (splitmix64): the same seed gives the same weights on every platform.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};
}  // namespace

void init_parameters(Graph& g, std::uint64_t seed) {
  Backend& be = g.backend();
  std::vector<float> params(g.param_arena_floats(), 0.0f), state(g.state_arena_floats(), 0.0f), logical;
  Rng rng{seed};
  for (const auto& e : g.params()) {
    logical.assign(e.numel(), 0.0f);
    switch (e.init) {
      case ParamInit::trunc_normal:  // torch.nn.init.trunc_normal_(std=s, a=-2, b=2): bounds are absolute
        for (auto& v : logical) {
          double x;
          do x = rng.normal() * e.init_std;
          while (x < -2.0 || x > 2.0);
          v = static_cast<float>(x);
        }
        break;
      case ParamInit::normal:  // torch.nn.init.kaiming_normal_: the std comes with the entry
        for (auto& v : logical) v = static_cast<float>(rng.normal() * e.init_std);
        break;
      case ParamInit::ones: logical.assign(e.numel(), 1.0f); break;
      case ParamInit::zeros: break;
      case ParamInit::uniform_fan_in: {
        const double bound = 1.0 / std::sqrt(static_cast<double>(e.fan_in));
        for (auto& v : logical) v = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
        break;
      }
    }
    float* dst = (e.trainable ? params.data() : state.data()) + e.offset;
    filter_to_storage(logical.data(), dst, e);
  }
  Stream& s = be.default_stream();
  be.copy(s, g.param_arena(), params.data(), params.size() * sizeof(float));
  if (!state.empty()) be.copy(s, g.state_arena(), state.data(), state.size() * sizeof(float));
  be.synchronize(s);
}

}  // namespace stepbench
