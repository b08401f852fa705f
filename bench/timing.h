// Timing helpers for the benchmarks: the machines are noisy, so compared variants are
// run interleaved (A, B, A, B, ...) and each reports its median.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace flexh2o::bench {

inline double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs every variant once for warm-up, then `reps` rounds of all variants in turn;
// returns the median seconds of each.
inline std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& variants, int reps) {
  std::vector<std::vector<double>> times(variants.size());
  for (const auto& v : variants) v();
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < variants.size(); ++i) times[i].push_back(seconds_of(variants[i]));
  std::vector<double> out;
  for (auto& t : times) out.push_back(median(t));
  return out;
}

}  // namespace flexh2o::bench
