#include <tbb/parallel_for.h>

#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"

namespace flexh2o::kernels {

namespace {

// Row r of the output from its normed values value(c): stored, added (accumulate) or rounded
// to bf16 as NormArgs says.
template <class Value>
void write_row(const NormArgs& a, std::int64_t r, Value value) {
  const std::int64_t base = r * a.cols;
  if (a.y_bf16) {
    for (std::int64_t c = 0; c < a.cols; ++c) a.y_bf16[base + c] = f32_to_bf16(value(c));
  } else if (a.accumulate) {
    for (std::int64_t c = 0; c < a.cols; ++c) a.y[base + c] += value(c);
  } else {
    for (std::int64_t c = 0; c < a.cols; ++c) a.y[base + c] = value(c);
  }
}

}  // namespace

void CpuBackend::do_layer_norm(const NormArgs& a) {
  tbb::parallel_for(std::int64_t{0}, a.rows, [&](std::int64_t r) {
    const float* x = a.x + r * a.cols;
    double sum = 0.0;
    for (std::int64_t c = 0; c < a.cols; ++c) sum += x[c];
    const float mean = static_cast<float>(sum / static_cast<double>(a.cols));
    double var = 0.0;  // two passes: E[(x-mean)^2] does not cancel like E[x^2]-mean^2
    for (std::int64_t c = 0; c < a.cols; ++c) {
      const float d = x[c] - mean;
      var += static_cast<double>(d) * d;
    }
    const float inv = 1.0f / std::sqrt(static_cast<float>(var / static_cast<double>(a.cols)) + a.eps);
    write_row(a, r, [&](std::int64_t c) {
      const float v = (x[c] - mean) * inv * (a.weight[c] + a.weight_offset);
      return a.bias ? v + a.bias[c] : v;
    });
  });
}

void CpuBackend::do_rms_norm(const NormArgs& a) {
  tbb::parallel_for(std::int64_t{0}, a.rows, [&](std::int64_t r) {
    const float* x = a.x + r * a.cols;
    double ss = 0.0;
    for (std::int64_t c = 0; c < a.cols; ++c) ss += static_cast<double>(x[c]) * x[c];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(a.cols)) + a.eps);
    write_row(a, r, [&](std::int64_t c) { return x[c] * inv * (a.weight[c] + a.weight_offset); });
  });
}

}  // namespace flexh2o::kernels
