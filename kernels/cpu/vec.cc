#include "kernels/cpu/vec.h"

#include <cpuid.h>
#include <immintrin.h>

namespace flexh2o::kernels::vec {

namespace {

bool cpu_has_avx2_fma() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_FMA) || !(c & bit_AVX) || !(c & bit_OSXSAVE)) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & bit_AVX2;
}
const bool kAvx2Fma = cpu_has_avx2_fma();

__attribute__((target("avx2,fma"))) float hsum_avx2(__m256 s) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, std::int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float r = hsum_avx2(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

__attribute__((target("avx2,fma"))) void dot_and_square_avx2(const float* a, const float* b, std::int64_t n,
                                                             float& ab, float& bb) {
  __m256 sab = _mm256_setzero_ps(), sbb = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 bv = _mm256_loadu_ps(b + i);
    sab = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), bv, sab);
    sbb = _mm256_fmadd_ps(bv, bv, sbb);
  }
  ab = hsum_avx2(sab);
  bb = hsum_avx2(sbb);
  for (; i < n; ++i) {
    ab += a[i] * b[i];
    bb += b[i] * b[i];
  }
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float s, const float* x, float* y, std::int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(sv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += s * x[i];
}

}  // namespace

float dot(const float* a, const float* b, std::int64_t n) {
  if (kAvx2Fma) return dot_avx2(a, b, n);
  float r = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) r += a[i] * b[i];
  return r;
}

void dot_and_square(const float* a, const float* b, std::int64_t n, float& ab, float& bb) {
  if (kAvx2Fma) return dot_and_square_avx2(a, b, n, ab, bb);
  ab = bb = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    ab += a[i] * b[i];
    bb += b[i] * b[i];
  }
}

void axpy(float s, const float* x, float* y, std::int64_t n) {
  if (kAvx2Fma) return axpy_avx2(s, x, y, n);
  for (std::int64_t i = 0; i < n; ++i) y[i] += s * x[i];
}

}  // namespace flexh2o::kernels::vec
