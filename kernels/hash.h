// A small integer mixer (SplitMix64's finaliser) for counter-based randomness: seeded
// sampling and dummy weights derive every value from a hash of its indices.
#pragma once
#include <cstdint>

namespace flexh2o::kernels {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from the top 53 bits of a hash.
inline double unit_interval(std::uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

}  // namespace flexh2o::kernels
