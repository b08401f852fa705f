#include <tbb/parallel_for.h>

#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace flexh2o::kernels {

namespace {
// Element loops are memory bound: chunks of 16K elements keep task overhead small.
template <class F>
void for_chunks(std::int64_t n, F&& f) {
  constexpr std::int64_t kChunk = 16384;
  tbb::parallel_for(std::int64_t{0}, (n + kChunk - 1) / kChunk, [&](std::int64_t c) {
    const std::int64_t end = std::min(n, (c + 1) * kChunk);
    for (std::int64_t i = c * kChunk; i < end; ++i) f(i);
  });
}
}  // namespace

void CpuBackend::activation(Activation act, float* x, std::int64_t n) {
  switch (act) {
    case Activation::Relu:
      for_chunks(n, [x](std::int64_t i) { x[i] = x[i] > 0.0f ? x[i] : 0.0f; });
      return;
    case Activation::Gelu:
      for_chunks(n, [x](std::int64_t i) { x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f)); });
      return;
  }
}

void CpuBackend::silu_mul(const float* gate, const float* up, float* out, std::int64_t n) {
  for_chunks(n, [=](std::int64_t i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  });
}

void CpuBackend::add(float* x, const float* y, std::int64_t n) {
  for_chunks(n, [=](std::int64_t i) { x[i] += y[i]; });
}

}  // namespace flexh2o::kernels
