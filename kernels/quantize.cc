#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace flexh2o::kernels {

namespace {

constexpr float kF16Max = 65504.0f;

// The nearest fp16 at or below / at or above f (f finite, clamped to fp16's range).
std::uint16_t f16_down(float f) {
  f = std::clamp(f, -kF16Max, kF16Max);
  std::uint16_t h = f32_to_f16(f);
  if (f16_to_f32(h) > f) h = (h & 0x7fffu) == 0 ? 0x8001u : (h & 0x8000u) ? h + 1 : h - 1;
  return h;
}
std::uint16_t f16_up(float f) {
  f = std::clamp(f, -kF16Max, kF16Max);
  std::uint16_t h = f32_to_f16(f);
  if (f16_to_f32(h) < f) h = (h & 0x7fffu) == 0 ? 0x0001u : (h & 0x8000u) ? h - 1 : h + 1;
  return h;
}

std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

void quantize_row(const float* x, std::int64_t n, DType t, void* out) {
  const int levels = (1 << quant_bits(t)) - 1;
  auto* codes = static_cast<std::uint8_t*>(out);
  auto* params = static_cast<std::byte*>(out) + quant_code_bytes(t, n);
  if (t == DType::Q4) std::memset(codes, 0, static_cast<std::size_t>(quant_code_bytes(t, n)));
  for (std::int64_t g0 = 0, g = 0; g0 < n; g0 += kQuantGroup, ++g) {
    const std::int64_t g1 = std::min(n, g0 + kQuantGroup);
    const auto [lo, hi] = std::minmax_element(x + g0, x + g1);
    const std::uint16_t min_h = f16_down(*lo);
    const float m = f16_to_f32(min_h);
    const std::uint16_t scale_h = f16_up((*hi - m) / static_cast<float>(levels));
    const float s = f16_to_f32(scale_h);
    std::memcpy(params + 4 * g, &scale_h, 2);
    std::memcpy(params + 4 * g + 2, &min_h, 2);
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    for (std::int64_t i = g0; i < g1; ++i) {
      const int q = std::clamp(static_cast<int>((x[i] - m) * inv + 0.5f), 0, levels);
      if (t == DType::Q8)
        codes[i] = static_cast<std::uint8_t>(q);
      else
        codes[i / 2] |= static_cast<std::uint8_t>(q << (4 * (i % 2)));
    }
  }
}

void dequantize_row(const void* in, std::int64_t n, DType t, float* x) {
  const auto* codes = static_cast<const std::uint8_t*>(in);
  const auto* params = static_cast<const std::byte*>(in) + quant_code_bytes(t, n);
  for (std::int64_t g0 = 0, g = 0; g0 < n; g0 += kQuantGroup, ++g) {
    const std::int64_t g1 = std::min(n, g0 + kQuantGroup);
    const float s = f16_to_f32(load_u16(params + 4 * g)), m = f16_to_f32(load_u16(params + 4 * g + 2));
    if (t == DType::Q8) {
      for (std::int64_t i = g0; i < g1; ++i) x[i] = static_cast<float>(codes[i]) * s + m;
    } else {
      for (std::int64_t i = g0; i < g1; ++i) x[i] = static_cast<float>((codes[i / 2] >> (4 * (i % 2))) & 0xf) * s + m;
    }
  }
}

QuantGroupParams quant_group_params(const void* row, std::int64_t n, DType t, std::int64_t g) {
  const auto* params = static_cast<const std::byte*>(row) + quant_code_bytes(t, n) + 4 * g;
  return {f16_to_f32(load_u16(params)), f16_to_f32(load_u16(params + 2))};
}

}  // namespace flexh2o::kernels
