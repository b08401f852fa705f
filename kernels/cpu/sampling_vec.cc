#include "kernels/cpu/sampling_vec.h"

// GCC 12 takes the self-initialised placeholders inside its own AVX-512 intrinsics for
// uninitialised values (GCC bug 105593), from the header and where they inline.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/cpu/cpu_features.h"

namespace flexh2o::kernels::sampling_vec {

namespace {

const bool kHasAvx2 = cpu_has_avx2_fma_f16c(), kHasAvx512 = cpu_has_avx512f();
const Isa kIsa = kHasAvx512 ? Isa::Avx512 : (kHasAvx2 ? Isa::Avx2 : Isa::Scalar);

Isa checked(Isa isa) {
  if ((isa == Isa::Avx512 && !kHasAvx512) || (isa == Isa::Avx2 && !kHasAvx2))
    throw std::invalid_argument("sampling_vec: this CPU lacks the instruction set asked for");
  return isa;
}

// exp(x) = 2^n exp(r), n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2] (Cody and Waite's
// two-part ln2: n * kLn2Hi is exact for |n| < 2^21), exp(r) by its Taylor polynomial of degree
// 13, and 2^n put into the exponent bits (normal for the x >= kLowest the vector paths take).
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kShift = 0x1.8p52;  // adding it rounds to an integer, held in the low bits
constexpr double kLowest = -700.0;   // below: the reference's own std::exp
constexpr double kTaylor[] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                              1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,      1.0 / 720.0,
                              1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,         0.5,
                              1.0,                1.0};  // 1/13! ... 1/0!

double reference_term(float z, float mx, double temperature) { return std::exp(static_cast<double>(z - mx) / temperature); }

__attribute__((target("avx512f"))) __m512d exp_avx512(__m512d x) {
  const __m512d shift = _mm512_set1_pd(kShift);
  const __m512d t = _mm512_fmadd_pd(x, _mm512_set1_pd(kLog2e), shift);
  const __m512d n = _mm512_sub_pd(t, shift);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kLn2Hi), x);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kLn2Lo), r);
  __m512d p = _mm512_set1_pd(kTaylor[0]);
  for (int k = 1; k < 14; ++k) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kTaylor[k]));
  const __m512i n_int = _mm512_sub_epi64(_mm512_castpd_si512(t), _mm512_castpd_si512(shift));
  const __m512i two_n = _mm512_slli_epi64(_mm512_add_epi64(n_int, _mm512_set1_epi64(1023)), 52);
  return _mm512_mul_pd(p, _mm512_castsi512_pd(two_n));
}

__attribute__((target("avx2,fma"))) __m256d exp_avx2(__m256d x) {
  const __m256d shift = _mm256_set1_pd(kShift);
  const __m256d t = _mm256_fmadd_pd(x, _mm256_set1_pd(kLog2e), shift);
  const __m256d n = _mm256_sub_pd(t, shift);
  __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kLn2Hi), x);
  r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kLn2Lo), r);
  __m256d p = _mm256_set1_pd(kTaylor[0]);
  for (int k = 1; k < 14; ++k) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kTaylor[k]));
  const __m256i n_int = _mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_castpd_si256(shift));
  const __m256i two_n = _mm256_slli_epi64(_mm256_add_epi64(n_int, _mm256_set1_epi64x(1023)), 52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(two_n));
}

// The lanes of a block the vector exp leaves out (below kLowest, or NaN): the reference's terms.
// A -inf logit (a token a mask leaves out) is a term of exactly 0, which adds nothing.
void add_reference_terms(const float* z, unsigned lanes_left_out, float mx, double temperature, ExpSum& s) {
  for (; lanes_left_out != 0; lanes_left_out &= lanes_left_out - 1) {
    const float zi = z[__builtin_ctz(lanes_left_out)];
    if (zi == -std::numeric_limits<float>::infinity()) continue;
    const double e = reference_term(zi, mx, temperature);
    s.total += e;
    s.positive += e > 0.0;
  }
}

__attribute__((target("avx512f"))) ExpSum exp_sum_avx512(const float* z, std::int64_t n, float mx, double temperature) {
  const __m256 mxv = _mm256_set1_ps(mx);
  const __m512d inv_t = _mm512_set1_pd(1.0 / temperature), lowest = _mm512_set1_pd(kLowest);
  __m512d acc = _mm512_setzero_pd();
  ExpSum s;
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    // z - mx rounds in fp32 as the reference's does, then widens.
    const __m512d x = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_sub_ps(_mm256_loadu_ps(z + i), mxv)), inv_t);
    const __mmask8 in_range = _mm512_cmp_pd_mask(x, lowest, _CMP_GE_OQ);
    acc = _mm512_add_pd(acc, _mm512_maskz_mov_pd(in_range, exp_avx512(_mm512_maskz_mov_pd(in_range, x))));
    s.positive += __builtin_popcount(in_range);
    if (in_range != 0xff) add_reference_terms(z + i, ~in_range & 0xffu, mx, temperature, s);
  }
  s.total += _mm512_reduce_add_pd(acc);
  add_reference_terms(z + i, (1u << (n - i)) - 1, mx, temperature, s);
  return s;
}

__attribute__((target("avx2,fma"))) ExpSum exp_sum_avx2(const float* z, std::int64_t n, float mx, double temperature) {
  const __m128 mxv = _mm_set1_ps(mx);
  const __m256d inv_t = _mm256_set1_pd(1.0 / temperature), lowest = _mm256_set1_pd(kLowest);
  __m256d acc = _mm256_setzero_pd();
  ExpSum s;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d x = _mm256_mul_pd(_mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(z + i), mxv)), inv_t);
    const __m256d in_range = _mm256_cmp_pd(x, lowest, _CMP_GE_OQ);
    acc = _mm256_add_pd(acc, _mm256_and_pd(in_range, exp_avx2(_mm256_and_pd(in_range, x))));
    const auto mask = static_cast<unsigned>(_mm256_movemask_pd(in_range));
    s.positive += __builtin_popcount(mask);
    if (mask != 0xf) add_reference_terms(z + i, ~mask & 0xfu, mx, temperature, s);
  }
  const __m128d half = _mm_add_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd(acc, 1));
  s.total += _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half)));
  add_reference_terms(z + i, (1u << (n - i)) - 1, mx, temperature, s);
  return s;
}

__attribute__((target("avx512f"))) float max_avx512(const float* z, std::int64_t n) {
  __m512 m = _mm512_set1_ps(z[0]);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(z + i));
  float r = _mm512_reduce_max_ps(m);
  for (; i < n; ++i) r = std::max(r, z[i]);
  return r;
}

__attribute__((target("avx2,fma"))) float max_avx2(const float* z, std::int64_t n) {
  __m256 m = _mm256_set1_ps(z[0]);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(z + i));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float r = _mm_cvtss_f32(h);
  for (; i < n; ++i) r = std::max(r, z[i]);
  return r;
}

void push_lanes(unsigned lanes, std::int64_t base, std::vector<std::int32_t>& out) {
  for (; lanes != 0; lanes &= lanes - 1) out.push_back(static_cast<std::int32_t>(base + __builtin_ctz(lanes)));
}

__attribute__((target("avx512f"))) std::int64_t indices_avx512(const float* z, std::int64_t n, float low, float high,
                                                               std::vector<std::int32_t>& out) {
  const __m512 lo = _mm512_set1_ps(low), hi = _mm512_set1_ps(high);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(z + i);
    push_lanes(_mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(v, lo, _CMP_GE_OQ), v, hi, _CMP_LT_OQ), i, out);
  }
  return i;
}

__attribute__((target("avx2,fma"))) std::int64_t indices_avx2(const float* z, std::int64_t n, float low, float high,
                                                              std::vector<std::int32_t>& out) {
  const __m256 lo = _mm256_set1_ps(low), hi = _mm256_set1_ps(high);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(z + i);
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(v, lo, _CMP_GE_OQ), _mm256_cmp_ps(v, hi, _CMP_LT_OQ));
    push_lanes(static_cast<unsigned>(_mm256_movemask_ps(in)), i, out);
  }
  return i;
}

}  // namespace

#pragma GCC diagnostic pop

std::vector<Isa> supported_isas() {
  std::vector<Isa> has = {Isa::Scalar};
  if (kHasAvx2) has.push_back(Isa::Avx2);
  if (kHasAvx512) has.push_back(Isa::Avx512);
  return has;
}

float max_of(Isa isa, const float* z, std::int64_t n) {
  if (checked(isa) == Isa::Avx512) return max_avx512(z, n);
  if (isa == Isa::Avx2) return max_avx2(z, n);
  return *std::max_element(z, z + n);
}

float max_of(const float* z, std::int64_t n) { return max_of(kIsa, z, n); }

ExpSum exp_sum_reference(const float* z, std::int64_t n, float mx, double temperature) {
  ExpSum s;
  for (std::int64_t i = 0; i < n; ++i) {
    const double e = reference_term(z[i], mx, temperature);
    s.total += e;
    s.positive += e > 0.0;
  }
  return s;
}

ExpSum exp_sum(Isa isa, const float* z, std::int64_t n, float mx, double temperature) {
  if (checked(isa) == Isa::Avx512) return exp_sum_avx512(z, n, mx, temperature);
  if (isa == Isa::Avx2) return exp_sum_avx2(z, n, mx, temperature);
  return exp_sum_reference(z, n, mx, temperature);
}

ExpSum exp_sum(const float* z, std::int64_t n, float mx, double temperature) {
  return exp_sum(kIsa, z, n, mx, temperature);
}

void indices_in(Isa isa, const float* z, std::int64_t n, float low, float high, std::vector<std::int32_t>& out) {
  out.clear();
  std::int64_t i = 0;
  if (checked(isa) == Isa::Avx512) i = indices_avx512(z, n, low, high, out);
  else if (isa == Isa::Avx2) i = indices_avx2(z, n, low, high, out);
  for (; i < n; ++i)
    if (z[i] >= low && z[i] < high) out.push_back(static_cast<std::int32_t>(i));
}

void indices_in(const float* z, std::int64_t n, float low, float high, std::vector<std::int32_t>& out) {
  indices_in(kIsa, z, n, low, high, out);
}

}  // namespace flexh2o::kernels::sampling_vec
