// The data layer's random numbers: splitmix64 and a uniform double from it, seeded per image, so the
// crops, flips and synthetic images follow from the seed alone (augment.cpp, folder.cpp).
#pragma once
#include <cstdint>

namespace stepbench {

inline std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// In [0, 1), 53 random bits.
inline double uniform(std::uint64_t& s) { return static_cast<double>(splitmix(s) >> 11) * 0x1.0p-53; }

}  // namespace stepbench
