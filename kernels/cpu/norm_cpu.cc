#include <tbb/parallel_for.h>

#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace flexh2o::kernels {

void CpuBackend::do_layer_norm(const NormArgs& a) {
  tbb::parallel_for(std::int64_t{0}, a.rows, [&](std::int64_t r) {
    const float* x = a.x + r * a.cols;
    float* y = a.y + r * a.cols;
    double sum = 0.0;
    for (std::int64_t c = 0; c < a.cols; ++c) sum += x[c];
    const float mean = static_cast<float>(sum / static_cast<double>(a.cols));
    double var = 0.0;  // two passes: E[(x-mean)^2] does not cancel like E[x^2]-mean^2
    for (std::int64_t c = 0; c < a.cols; ++c) {
      const float d = x[c] - mean;
      var += static_cast<double>(d) * d;
    }
    const float inv = 1.0f / std::sqrt(static_cast<float>(var / static_cast<double>(a.cols)) + a.eps);
    for (std::int64_t c = 0; c < a.cols; ++c) {
      const float v = (x[c] - mean) * inv * (a.weight[c] + a.weight_offset);
      y[c] = a.bias ? v + a.bias[c] : v;
    }
  });
}

void CpuBackend::do_rms_norm(const NormArgs& a) {
  tbb::parallel_for(std::int64_t{0}, a.rows, [&](std::int64_t r) {
    const float* x = a.x + r * a.cols;
    float* y = a.y + r * a.cols;
    double ss = 0.0;
    for (std::int64_t c = 0; c < a.cols; ++c) ss += static_cast<double>(x[c]) * x[c];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(a.cols)) + a.eps);
    for (std::int64_t c = 0; c < a.cols; ++c) y[c] = x[c] * inv * (a.weight[c] + a.weight_offset);
  });
}

}  // namespace flexh2o::kernels
