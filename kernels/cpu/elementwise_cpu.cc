#include <tbb/parallel_for.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/vec.h"
#include "kernels/dtype.h"

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

namespace {
// One row of bias_act in fp32 (x, up and out at the row).
void bias_act_row(const BiasActArgs& a, const float* x, const float* up, float* out) {
  if (a.act == Activation::Silu && !a.bias) return vec::silu_times(x, up, out, a.cols);
  for (std::int64_t c = 0; c < a.cols; ++c) {
    const float v = activate(a.act, a.bias ? x[c] + a.bias[c] : x[c]);
    out[c] = up ? v * up[c] : v;
  }
}
}  // namespace

// bf16 out: the fp32 row rounded, so it is the fp32 result rounded bit for bit (and out_bf16
// may be x's memory: the row is read whole before it is written).
void CpuBackend::do_bias_act(const BiasActArgs& a) {
  tbb::parallel_for(std::int64_t{0}, a.rows, [&](std::int64_t r) {
    const float* x = a.x + r * a.cols;
    const float* up = a.up ? a.up + r * a.cols : nullptr;
    if (!a.out_bf16) return bias_act_row(a, x, up, a.out + r * a.cols);
    std::vector<float> row(static_cast<std::size_t>(a.cols));
    bias_act_row(a, x, up, row.data());
    convert_from_f32(row.data(), DType::BF16, a.out_bf16 + r * (a.out_stride ? a.out_stride : a.cols), row.size());
  });
}

void CpuBackend::do_softcap(float* x, std::int64_t n, float cap) {
  for_chunks(n, [=](std::int64_t i) { x[i] = cap * std::tanh(x[i] / cap); });
}

void CpuBackend::do_add(float* x, const float* y, std::int64_t n) {
  for_chunks(n, [=](std::int64_t i) { x[i] += y[i]; });
}

void CpuBackend::do_round_to_dtype(DType t, float* x, std::int64_t n) {
  for_chunks(n, [=](std::int64_t i) { x[i] = round_to(t, x[i]); });
}

}  // namespace flexh2o::kernels
