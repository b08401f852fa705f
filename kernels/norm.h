// Row normalisations: LayerNorm (OPT) and RMSNorm (LLaMA; Gemma's (1 + w) form).
#pragma once
#include <cstdint>

namespace flexh2o::kernels {

// y[r, :] = norm(x[r, :]) * (weight + weight_offset) + bias, for `rows` rows of `cols` elements.
// layer_norm: (x - mean) / sqrt(var + eps); rms_norm: x / sqrt(mean(x^2) + eps), bias unused.
// Two fused forms save a pass over the rows each: `accumulate` adds the result into y (a
// sandwich norm's residual add, h += norm(out)); y_bf16 takes it rounded to bf16 (as
// kernels::f32_to_bf16 rounds) instead of y, for the bf16 GEMMs that read it next
// (GemmArgs::x_bf16).
struct NormArgs {
  const float* x = nullptr;
  float* y = nullptr;  // may equal x, except with accumulate
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const float* weight = nullptr;  // [cols]
  const float* bias = nullptr;    // [cols], optional
  float eps = 1e-5f;
  float weight_offset = 0.0f;  // Gemma's RMSNorm scales by (1 + w)
  bool accumulate = false;      // y += norm(x)
  std::uint16_t* y_bf16 = nullptr;  // instead of y: [rows, cols] bf16, not overlapping x
};

}  // namespace flexh2o::kernels
