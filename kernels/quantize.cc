#include "kernels/quantize.h"

#include "kernels/quantize_code.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <immintrin.h>

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

// 16 codes (8 bytes) at a time: split the nibbles, interleave them back into element order,
// widen to fp32 and apply q * s + m as a multiply then an add (no FMA: the same rounding as the
// scalar path and the CUDA kernel). Returns the values written (blocks * 16).
__attribute__((target("avx2"))) std::int64_t dequantize_q4_avx2(const std::uint8_t* codes, std::int64_t blocks,
                                                                 float s, float m, float* x) {
  const __m256 vs = _mm256_set1_ps(s), vm = _mm256_set1_ps(m);
  const __m128i low = _mm_set1_epi8(0x0f);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8 * b));
    const __m128i lo = _mm_and_si128(bytes, low), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
    const __m128i q = _mm_unpacklo_epi8(lo, hi);  // element order: lo0 hi0 lo1 hi1 ...
    const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
    const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)));
    _mm256_storeu_ps(x + 16 * b, _mm256_add_ps(_mm256_mul_ps(a, vs), vm));
    _mm256_storeu_ps(x + 16 * b + 8, _mm256_add_ps(_mm256_mul_ps(c, vs), vm));
  }
  return 16 * blocks;
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

void quantize_row(const float* x, std::int64_t n, DType t, void* out) {
  const int bits = quant_bits(t), levels = (1 << bits) - 1;
  const std::int64_t group = quant_group_size(t);
  auto* codes = static_cast<std::uint8_t*>(out);
  auto* params = static_cast<std::byte*>(out) + quant_code_bytes(t, n);
  if (bits == 4) std::memset(codes, 0, static_cast<std::size_t>(quant_code_bytes(t, n)));
  for (std::int64_t g0 = 0, g = 0; g0 < n; g0 += group, ++g) {
    const std::int64_t g1 = std::min(n, g0 + group);
    float lo = 0, hi = 0;
    quant_group_range(x + g0, g1 - g0, lo, hi);
    const std::uint16_t min_h = f16_down(lo);
    const float m = f16_to_f32(min_h);
    const std::uint16_t scale_h = f16_up((hi - m) / static_cast<float>(levels));
    const float s = f16_to_f32(scale_h);
    std::memcpy(params + 4 * g, &scale_h, 2);
    std::memcpy(params + 4 * g + 2, &min_h, 2);
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    for (std::int64_t i = g0; i < g1; ++i) {
      const int q = quant_code(quant_position(x[i], m, inv), levels);
      if (bits == 8)
        codes[i] = static_cast<std::uint8_t>(q);
      else
        codes[i / 2] |= static_cast<std::uint8_t>(q << (4 * (i % 2)));
    }
  }
}

void dequantize_row(const void* in, std::int64_t n, DType t, float* x) {
  const auto* codes = static_cast<const std::uint8_t*>(in);
  const auto* params = static_cast<const std::byte*>(in) + quant_code_bytes(t, n);
  const std::int64_t group = quant_group_size(t);
  for (std::int64_t g0 = 0, g = 0; g0 < n; g0 += group, ++g) {
    const std::int64_t g1 = std::min(n, g0 + group);
    const float s = f16_to_f32(load_u16(params + 4 * g)), m = f16_to_f32(load_u16(params + 4 * g + 2));
    if (quant_bits(t) == 8) {
      for (std::int64_t i = g0; i < g1; ++i) x[i] = static_cast<float>(codes[i]) * s + m;
      continue;
    }
    // Groups start at even elements: whole bytes (low nibble first), then an odd tail.
    std::int64_t done = 0;
    if (kHaveAvx2) done = dequantize_q4_avx2(codes + g0 / 2, (g1 - g0) / 16, s, m, x + g0);
    if (done == g1 - g0) continue;
    // The rest (and CPUs without AVX2) through a table of the 16 values.
    float level[16];
    for (int q = 0; q < 16; ++q) level[q] = static_cast<float>(q) * s + m;
    const std::uint8_t* c = codes + (g0 + done) / 2;
    float* out = x + g0 + done;
    const std::int64_t pairs = (g1 - g0 - done) / 2;
    for (std::int64_t p = 0; p < pairs; ++p) {
      out[2 * p] = level[c[p] & 0xf];
      out[2 * p + 1] = level[c[p] >> 4];
    }
    if ((g1 - g0 - done) % 2) out[2 * pairs] = level[c[pairs] & 0xf];
  }
}

QuantGroupParams quant_group_params(const void* row, std::int64_t n, DType t, std::int64_t g) {
  const auto* params = static_cast<const std::byte*>(row) + quant_code_bytes(t, n) + 4 * g;
  return {f16_to_f32(load_u16(params)), f16_to_f32(load_u16(params + 2))};
}

}  // namespace flexh2o::kernels
