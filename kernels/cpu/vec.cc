#include "kernels/cpu/vec.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

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

__attribute__((target("avx2,fma"))) float max_avx2(const float* x, std::int64_t n) {
  __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  float r = *std::max_element(lanes, lanes + 8);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

// exp(x) as Cephes' expf: x = k ln 2 + r with |r| <= ln 2 / 2 (ln 2 split in two for an exact
// k ln 2), a degree-7 polynomial for exp(r), times 2^k. 0 below ln 2^-126, where the result
// would be subnormal; x at most 88.37 (exp(x) < FLT_MAX).
__attribute__((target("avx2,fma"))) __m256 exp_avx2(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654475f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654475f)), _mm256_set1_ps(88.3762626647949f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^k from k + 127 in the exponent field (k >= -126 after the clamp).
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

__attribute__((target("avx2,fma"))) float exp_shifted_avx2(float* x, std::int64_t n, float shift) {
  const __m256 sv = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), sv));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {  // the tail through the same vector exp, padded with zeros that add nothing
    alignas(32) float tail[8] = {};
    std::copy(x + i, x + n, tail);
    const __m256 live = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7),
                                      _mm256_set1_ps(static_cast<float>(n - i)), _CMP_LT_OQ);
    const __m256 e = _mm256_and_ps(live, exp_avx2(_mm256_sub_ps(_mm256_load_ps(tail), sv)));
    _mm256_store_ps(tail, e);
    std::copy(tail, tail + (n - i), x + i);
    sum = _mm256_add_ps(sum, e);
  }
  return hsum_avx2(sum);
}

__attribute__((target("avx2,fma"))) void scale_avx2(float* x, std::int64_t n, float s) {
  const __m256 sv = _mm256_set1_ps(s);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(sv, _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] *= s;
}

// x / (1 + exp(-x)). Below x = -80, where exp(-x) nears fp32's overflow and x exp(x) nears its
// subnormals, x exp(x / 2) exp(x / 2) (1 + exp(-x) is exp(-x) to far below fp32 precision there).
__attribute__((target("avx2,fma"))) inline __m256 silu_avx2(__m256 x) {
  const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(-80.0f), _CMP_LT_OQ);
  const __m256 neg = _mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), _mm256_set1_ps(80.0f));
  const __m256 s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_avx2(neg)));
  if (_mm256_movemask_ps(low) == 0) return s;
  const __m256 h = exp_avx2(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)));
  return _mm256_blendv_ps(s, _mm256_mul_ps(_mm256_mul_ps(x, h), h), low);
}

__attribute__((target("avx2,fma"))) void silu_times_avx2(const float* gate, const float* up, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 s = silu_avx2(_mm256_loadu_ps(gate + i));
    _mm256_storeu_ps(out + i, up ? _mm256_mul_ps(s, _mm256_loadu_ps(up + i)) : s);
  }
  if (i < n) {  // the tail through the same vector path
    alignas(32) float g[8] = {}, u[8] = {};
    std::copy(gate + i, gate + n, g);
    if (up) std::copy(up + i, up + n, u);
    const __m256 s = silu_avx2(_mm256_load_ps(g));
    _mm256_store_ps(g, up ? _mm256_mul_ps(s, _mm256_load_ps(u)) : s);
    std::copy(g, g + (n - i), out + i);
  }
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

float max(const float* x, std::int64_t n) {
  if (kAvx2Fma) return max_avx2(x, n);
  float r = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

float exp_shifted(float* x, std::int64_t n, float shift) {
  if (kAvx2Fma) return exp_shifted_avx2(x, n, shift);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) sum += x[i] = std::exp(x[i] - shift);
  return sum;
}

void scale(float* x, std::int64_t n, float s) {
  if (kAvx2Fma) return scale_avx2(x, n, s);
  for (std::int64_t i = 0; i < n; ++i) x[i] *= s;
}

void silu_times(const float* gate, const float* up, float* out, std::int64_t n) {
  if (kAvx2Fma) return silu_times_avx2(gate, up, out, n);
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = gate[i] / (1.0f + std::exp(-gate[i]));
    out[i] = up ? s * up[i] : s;
  }
}

}  // namespace flexh2o::kernels::vec
