#include <tbb/parallel_for.h>

#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/vec.h"

namespace flexh2o::kernels {

namespace {
// Element loops are memory bound: chunks of 16K elements keep task overhead small.
constexpr std::int64_t kChunk = 16384;

// f(begin, end) over chunks of [0, n).
template <class F>
void for_ranges(std::int64_t n, F&& f) {
  tbb::parallel_for(std::int64_t{0}, (n + kChunk - 1) / kChunk,
                    [&](std::int64_t c) { f(c * kChunk, std::min(n, (c + 1) * kChunk)); });
}

template <class F>
void for_chunks(std::int64_t n, F&& f) {
  for_ranges(n, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) f(i);
  });
}
}  // namespace

namespace {
// One activation of x, in fp32 as transformers computes it.
inline float activate(Activation act, float x) {
  switch (act) {
    case Activation::Relu: return x > 0.0f ? x : 0.0f;
    case Activation::Gelu: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Activation::GeluTanh: return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case Activation::Silu: return x / (1.0f + std::exp(-x));
  }
  return x;
}
}  // namespace

void CpuBackend::do_activation(Activation act, float* x, std::int64_t n) {
  if (act == Activation::Silu)  // vectorised: SwiGLU models spend a few percent of a decode step here
    return for_ranges(n, [=](std::int64_t b, std::int64_t e) { vec::silu_times(x + b, nullptr, x + b, e - b); });
  for_chunks(n, [=](std::int64_t i) { x[i] = activate(act, x[i]); });
}

void CpuBackend::do_glu(Activation act, const float* gate, const float* up, float* out, std::int64_t n) {
  if (act == Activation::Silu)
    return for_ranges(n, [=](std::int64_t b, std::int64_t e) { vec::silu_times(gate + b, up + b, out + b, e - b); });
  for_chunks(n, [=](std::int64_t i) { out[i] = activate(act, gate[i]) * up[i]; });
}

void CpuBackend::do_softcap(float* x, std::int64_t n, float cap) {
  for_chunks(n, [=](std::int64_t i) { x[i] = cap * std::tanh(x[i] / cap); });
}

void CpuBackend::do_add(float* x, const float* y, std::int64_t n) {
  for_chunks(n, [=](std::int64_t i) { x[i] += y[i]; });
}

}  // namespace flexh2o::kernels
