#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/hash.h"

namespace flexh2o::kernels {

double sampling_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t step) {
  const std::uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ step);
  return unit_interval(h);
}

void CpuBackend::do_sample(const SampleArgs& a) {
  const SamplingParams& p = a.params;
  tbb::parallel_for(std::int64_t{0}, a.batch, [&](std::int64_t r) {
    const float* logits = a.logits + r * a.vocab;
    if (p.temperature <= 0.0f) {
      a.out[r] = static_cast<std::int32_t>(std::max_element(logits, logits + a.vocab) - logits);
      return;
    }
    // Probabilities at this temperature, in descending order; the nucleus is the shortest
    // prefix whose mass reaches top_p.
    const float mx = *std::max_element(logits, logits + a.vocab);
    std::vector<double> prob(static_cast<std::size_t>(a.vocab));
    double total = 0.0;
    for (std::int64_t i = 0; i < a.vocab; ++i) total += prob[i] = std::exp((logits[i] - mx) / p.temperature);
    std::vector<std::int32_t> order(static_cast<std::size_t>(a.vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t x, std::int32_t y) { return prob[x] > prob[y]; });
    std::size_t keep = order.size();
    if (p.top_p < 1.0f) {
      double mass = 0.0;
      for (std::size_t i = 0; i < order.size(); ++i) {
        mass += prob[order[i]] / total;
        if (mass >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    double kept = 0.0;
    for (std::size_t i = 0; i < keep; ++i) kept += prob[order[i]];
    const double u = sampling_uniform(p.seed, a.streams[r], a.step) * kept;
    double acc = 0.0;
    std::int32_t chosen = order[keep - 1];
    for (std::size_t i = 0; i < keep; ++i) {
      acc += prob[order[i]];
      if (u < acc) {
        chosen = order[i];
        break;
      }
    }
    a.out[r] = chosen;
  });
}

}  // namespace flexh2o::kernels
