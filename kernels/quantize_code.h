// The per-value arithmetic of group-wise quantization (kernels/quantize.h), shared by the CPU
// (kernels/quantize.cc) and the CUDA kernels (kernels/cuda/device_common.cuh) so that both
// give the same bytes for every input, +-inf, huge values and NaN included.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FLEXH2O_HOST_DEVICE __host__ __device__
#else
#define FLEXH2O_HOST_DEVICE
#endif

namespace flexh2o::kernels {

// The smallest and largest of x[0, n), n >= 1, as one sequential scan: the first smallest and
// the last largest (std::minmax_element's choice for ordered values); a NaN is never picked
// after the first element.
FLEXH2O_HOST_DEVICE inline void quant_group_range(const float* x, std::int64_t n, float& lo, float& hi) {
  lo = x[0];
  hi = x[0];
  for (std::int64_t i = 1; i < n; ++i) {
    if (x[i] < lo) lo = x[i];
    if (!(x[i] < hi)) hi = x[i];
  }
}

// Where x falls between the levels of a group with minimum m and inverse step inv, as a
// multiply then an add, each rounded (no FMA, which nvcc would otherwise contract to).
FLEXH2O_HOST_DEVICE inline float quant_position(float x, float m, float inv) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(__fsub_rn(x, m), inv), 0.5f);
#else
  return (x - m) * inv + 0.5f;  // quantize.cc is compiled with -ffp-contract=off
#endif
}

// The code of a position: clamped as a float first, so every value converts in range (+inf
// and huge values give `levels`, -inf, negatives and NaN give 0), then truncated.
FLEXH2O_HOST_DEVICE inline int quant_code(float v, int levels) {
  return v >= static_cast<float>(levels) ? levels : v > 0.0f ? static_cast<int>(v) : 0;
}

}  // namespace flexh2o::kernels
