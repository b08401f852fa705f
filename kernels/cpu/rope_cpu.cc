#include <tbb/parallel_for.h>

#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace flexh2o::kernels {

void CpuBackend::do_rope(const RopeArgs& a) {
  const std::int64_t half = a.rotary_dim / 2;
  // Pair i of a head: (first, second) element offsets in the chosen layout.
  const bool interleaved = a.layout == RopeLayout::Interleaved;
  tbb::parallel_for(std::int64_t{0}, a.tokens, [&](std::int64_t t) {
    const float pos = static_cast<float>(a.positions[t]);
    for (std::int64_t i = 0; i < half; ++i) {
      const float angle = pos * a.inv_freq[i];
      const float c = std::cos(angle) * a.attention_factor, s = std::sin(angle) * a.attention_factor;
      const std::int64_t i0 = interleaved ? 2 * i : i;
      const std::int64_t i1 = interleaved ? 2 * i + 1 : i + half;
      for (std::int64_t h = 0; h < a.heads; ++h) {
        float* x = a.x + (t * a.heads + h) * a.head_dim;
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
      }
    }
  });
}

}  // namespace flexh2o::kernels
