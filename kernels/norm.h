// Row normalisations: LayerNorm (OPT) and RMSNorm (LLaMA; Gemma's (1 + w) form).
#pragma once
#include <cstdint>

namespace flexh2o::kernels {

// y[r, :] = norm(x[r, :]) * (weight + weight_offset) + bias, for `rows` rows of `cols` elements.
// layer_norm: (x - mean) / sqrt(var + eps); rms_norm: x / sqrt(mean(x^2) + eps), bias unused.
struct NormArgs {
  const float* x = nullptr;
  float* y = nullptr;  // may equal x
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const float* weight = nullptr;  // [cols]
  const float* bias = nullptr;    // [cols], optional
  float eps = 1e-5f;
  float weight_offset = 0.0f;  // Gemma's RMSNorm scales by (1 + w)
};

}  // namespace flexh2o::kernels
