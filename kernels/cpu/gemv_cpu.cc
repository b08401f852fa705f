#include "kernels/cpu/gemv_cpu.h"

#include <cpuid.h>
#include <immintrin.h>

namespace flexh2o::kernels {

namespace {

bool cpu_has_avx2_fma_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  if (!(c & bit_FMA) || !(c & bit_AVX) || !(c & bit_OSXSAVE) || !(c & bit_F16C)) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & bit_AVX2;
}
const bool kSupported = cpu_has_avx2_fma_f16c();

// 8 weights of a row as fp32.
template <DType T>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const void* row, std::int64_t i) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else if constexpr (T == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(row) + i)));
  } else {  // bf16: the top half of an fp32
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(row) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType T>
inline float load1(const void* row, std::int64_t i) {
  const auto* h = static_cast<const std::uint16_t*>(row);
  if constexpr (T == DType::F32) return static_cast<const float*>(row)[i];
  if constexpr (T == DType::F16) return f16_to_f32(h[i]);
  return bf16_to_f32(h[i]);
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

template <DType T, int M>
__attribute__((target("avx2,fma,f16c"))) void rows(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  const std::int64_t k = a.w.cols, n = a.w.rows, rb = row_bytes(T, k);
  for (std::int64_t r = n0; r < n1; ++r) {
    const void* w = static_cast<const char*>(a.w.data) + r * rb;
    __m256 acc[M];
    for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
    std::int64_t c = 0;
    for (; c + 8 <= k; c += 8) {
      const __m256 wv = load8<T>(w, c);
      for (int i = 0; i < M; ++i) acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.x + i * k + c), acc[i]);
    }
    for (int i = 0; i < M; ++i) {
      float s = hsum(acc[i]);
      for (std::int64_t t = c; t < k; ++t) s += load1<T>(w, t) * a.x[i * k + t];
      if (a.bias) s += a.bias[r];
      float& y = a.y[i * n + r];
      y = a.beta != 0.0f ? y + s : s;
    }
  }
}

template <DType T>
void dispatch_rows(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  switch (a.m) {
    case 1: return rows<T, 1>(a, n0, n1);
    case 2: return rows<T, 2>(a, n0, n1);
    case 3: return rows<T, 3>(a, n0, n1);
    default: return rows<T, 4>(a, n0, n1);
  }
}

}  // namespace

bool gemv_small_m_applies(const GemmArgs& a) {
  const DType t = a.w.dtype;
  return kSupported && a.compute == DType::F32 && a.m >= 1 && a.m <= kGemvMaxRows &&
         (t == DType::F32 || t == DType::F16 || t == DType::BF16);
}

void gemv_small_m(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  switch (a.w.dtype) {
    case DType::F32: return dispatch_rows<DType::F32>(a, n0, n1);
    case DType::F16: return dispatch_rows<DType::F16>(a, n0, n1);
    default: return dispatch_rows<DType::BF16>(a, n0, n1);
  }
}

}  // namespace flexh2o::kernels
