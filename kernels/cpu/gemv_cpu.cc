#include "kernels/cpu/gemv_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_features.h"
#include "kernels/quantize.h"

namespace flexh2o::kernels {

namespace {

constexpr std::int64_t kGemvRowsAtOnce = 4;

const bool kSupported = cpu_has_avx2_fma_f16c();

constexpr bool is_q8(DType t) { return t == DType::Q8 || t == DType::Q8G32; }

// 8 weights of a float row as fp32.
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

// 8 codes of a q8 row, expanded as q * s + m.
__attribute__((target("avx2,fma"))) inline __m256 load8_q8(const std::uint8_t* codes, std::int64_t i, __m256 s, __m256 m) {
  const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), s, m);
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

// R weight rows dotted with M activation rows at once: R * M = 4 independent FMA chains
// (FMA latency does not hold up a single row), and each activation load serves R rows.
template <int M>
struct Dots {
  static constexpr int R = M == 1 ? 4 : M == 2 ? 2 : 1;
  __m256 acc[R][M];
  float tail[R][M] = {};

  __attribute__((target("avx2,fma"))) Dots() {
    for (int j = 0; j < R; ++j)
      for (int i = 0; i < M; ++i) acc[j][i] = _mm256_setzero_ps();
  }
  // Adds w_j[c, c + 8) * x_i[c, c + 8) for every activation row i, w[j] holding row j's values.
  __attribute__((target("avx2,fma"))) void add(const __m256 (&w)[R], const float* x, std::int64_t k, std::int64_t c) {
    for (int i = 0; i < M; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * k + c);
      for (int j = 0; j < R; ++j) acc[j][i] = _mm256_fmadd_ps(w[j], xv, acc[j][i]);
    }
  }
};

// y rows [r, r + rows) from the first `rows` weight rows of d. Compiled for AVX too: hsum takes
// an __m256 in a register, which a caller without AVX would pass in memory (unoptimised builds
// do not inline it).
template <int M>
__attribute__((target("avx2,fma"))) void store(const GemmArgs& a, std::int64_t r, int rows, const Dots<M>& d) {
  const std::int64_t n = a.w.rows;
  for (int j = 0; j < rows; ++j)
    for (int i = 0; i < M; ++i) {
      float s = hsum(d.acc[j][i]) + d.tail[j][i];
      if (a.bias) s += a.bias[r + j];
      float& y = a.y[i * n + r + j];
      y = a.beta != 0.0f ? y + s : s;
    }
}

template <DType T, int M>
__attribute__((target("avx2,fma,f16c"))) void float_rows(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  const std::int64_t k = a.w.cols, rb = row_bytes(T, k);
  constexpr int R = Dots<M>::R;
  for (std::int64_t r = n0; r < n1; r += R) {
    const int rows = static_cast<int>(std::min<std::int64_t>(R, n1 - r));
    const char* w[R];
    for (int j = 0; j < R; ++j) w[j] = static_cast<const char*>(a.w.data) + (r + std::min(j, rows - 1)) * rb;
    Dots<M> d;
    std::int64_t c = 0;
    for (; c + 8 <= k; c += 8) {
      __m256 wv[R];
      for (int j = 0; j < R; ++j) wv[j] = load8<T>(w[j], c);
      d.add(wv, a.x, k, c);
    }
    for (; c < k; ++c)
      for (int j = 0; j < R; ++j)
        for (int i = 0; i < M; ++i) d.tail[j][i] += load1<T>(w[j], c) * a.x[i * k + c];
    store(a, r, rows, d);
  }
}

// q8 rows (kernels/quantize.h): each group's codes expand in registers to q * s + m with the
// group's (s, m) and go into the same dot products, so the weights move one byte per value.
template <DType T, int M>
__attribute__((target("avx2,fma,f16c"))) void q8_rows(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  const std::int64_t k = a.w.cols, rb = row_bytes(T, k), group = quant_group_size(T), code_bytes = quant_code_bytes(T, k);
  constexpr int R = Dots<M>::R;
  for (std::int64_t r = n0; r < n1; r += R) {
    const int rows = static_cast<int>(std::min<std::int64_t>(R, n1 - r));
    const std::uint8_t* codes[R];
    for (int j = 0; j < R; ++j)
      codes[j] = static_cast<const std::uint8_t*>(a.w.data) + (r + std::min(j, rows - 1)) * rb;
    Dots<M> d;
    for (std::int64_t g0 = 0, g = 0; g0 < k; g0 += group, ++g) {
      float s[R], m[R];
      __m256 vs[R], vm[R];
      for (int j = 0; j < R; ++j) {  // (s, m): two fp16 next to each other, widened by F16C
        std::int32_t sm;
        std::memcpy(&sm, codes[j] + code_bytes + 4 * g, 4);
        const __m128 p = _mm_cvtph_ps(_mm_cvtsi32_si128(sm));
        vs[j] = _mm256_broadcastss_ps(p);
        vm[j] = _mm256_broadcastss_ps(_mm_movehdup_ps(p));
        s[j] = _mm_cvtss_f32(p);
        m[j] = _mm_cvtss_f32(_mm_movehdup_ps(p));
      }
      const std::int64_t g1 = std::min(k, g0 + group);
      std::int64_t c = g0;
      for (; c + 8 <= g1; c += 8) {
        __m256 wv[R];
        for (int j = 0; j < R; ++j) wv[j] = load8_q8(codes[j], c, vs[j], vm[j]);
        d.add(wv, a.x, k, c);
      }
      for (; c < g1; ++c)
        for (int j = 0; j < R; ++j)
          for (int i = 0; i < M; ++i) d.tail[j][i] += (static_cast<float>(codes[j][c]) * s[j] + m[j]) * a.x[i * k + c];
    }
    store(a, r, rows, d);
  }
}

template <DType T, int M>
void rows(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  if constexpr (is_q8(T))
    q8_rows<T, M>(a, n0, n1);
  else
    float_rows<T, M>(a, n0, n1);
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
  return kSupported && a.compute == DType::F32 && a.m >= 1 && a.m <= gemv_max_rows(t) &&
         (t == DType::F32 || t == DType::F16 || t == DType::BF16 || is_q8(t));
}

void gemv_small_m(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  // More than kGemvRowsAtOnce activation rows: a block of weight rows is read once from memory
  // and again from cache for each further group of activation rows.
  constexpr std::int64_t kBlock = 64;
  for (std::int64_t b0 = n0; b0 < n1; b0 += kBlock)
    for (std::int64_t i0 = 0; i0 < a.m; i0 += kGemvRowsAtOnce) {
      GemmArgs part = a;
      part.x = a.x + i0 * a.w.cols;
      part.y = a.y + i0 * a.w.rows;
      part.m = std::min(kGemvRowsAtOnce, a.m - i0);
      const std::int64_t b1 = std::min(n1, b0 + kBlock);
      switch (a.w.dtype) {
        case DType::F32: dispatch_rows<DType::F32>(part, b0, b1); break;
        case DType::F16: dispatch_rows<DType::F16>(part, b0, b1); break;
        case DType::BF16: dispatch_rows<DType::BF16>(part, b0, b1); break;
        case DType::Q8: dispatch_rows<DType::Q8>(part, b0, b1); break;
        default: dispatch_rows<DType::Q8G32>(part, b0, b1); break;
      }
    }
}

}  // namespace flexh2o::kernels
