// Reading fp32/fp16/bf16 rows as fp32 and summing vector lanes, shared by the CPU kernels that
// widen stored values in registers (gemm_tiled_cpu.cc, gemm_tiled_bf16_cpu.cc, attention_vec.cc).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"

namespace flexh2o::kernels {

// Element i of values stored in T (f32, f16 or bf16), as fp32 (exact).
template <DType T>
inline float stored_float(const void* values, std::int64_t i) {
  if constexpr (T == DType::F32) {
    float v;
    std::memcpy(&v, static_cast<const char*>(values) + 4 * i, 4);
    return v;
  } else {
    std::uint16_t h;
    std::memcpy(&h, static_cast<const char*>(values) + 2 * i, 2);
    return T == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
}

// Elements [i, i + 8) of values stored in T, as fp32: fp16 by F16C, bf16 as fp32's top half.
template <DType T>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8_floats(const void* values, std::int64_t i) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(values) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(values) + i));
    if constexpr (T == DType::F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Lane r of the result: ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)) of the r-th argument,
// a fixed order, so a sum does not depend on which other sums share the call.
__attribute__((target("avx2"))) inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

}  // namespace flexh2o::kernels
