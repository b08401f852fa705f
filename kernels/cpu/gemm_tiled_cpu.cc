#include "kernels/cpu/gemm_tiled_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/float_lanes.h"
#include "kernels/cpu/gemm_tile_walk.h"
#include "kernels/cpu/gemm_tile_sums.h"
#include "kernels/quantize.h"

namespace flexh2o::kernels {

namespace {

const bool kSupported = cpu_has_avx2_fma_f16c();

constexpr int kR = static_cast<int>(kTiledWeightRows);
constexpr int kM = 3;  // activation rows per micro-kernel call: 12 accumulators + 3 x + 1 w = 16 ymm
// Widest chunk of k: the widened tile (kR x this, 16 KiB) stays in L1.
constexpr std::int64_t kMaxChunk = 1024;
constexpr std::int64_t kBlockRows = kTiledTaskRows;

// Columns of k per chunk: k cut into equal chunks of at most kMaxChunk, each a multiple of 64 so
// that every quantization group (32 or 64) lies in one chunk. It depends on k alone: the chunks
// fix each output's summation order (8 lanes per chunk, then the chunks in turn), so a row's
// result does not depend on how many other rows share the GEMM. x's chunk stays in L2 across
// the tiles of a block up to the path's 128 rows (128 x 1024 floats: 512 KiB).
std::int64_t chunk_cols(std::int64_t k) { return equal_chunks(k, kMaxChunk, 64); }

std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Columns [c0, c0 + len) of a float row as fp32.
template <DType T>
__attribute__((target("avx2,fma,f16c"))) void widen_float(const std::uint8_t* row, std::int64_t c0, std::int64_t len,
                                                          float* out) {
  std::int64_t i = 0;
  for (; i + 8 <= len; i += 8) _mm256_storeu_ps(out + i, load8_floats<T>(row, c0 + i));
  for (; i < len; ++i) out[i] = stored_float<T>(row, c0 + i);
}

// Columns [c0, c0 + len) of a quantized row (kernels/quantize.h) as q * s + m; c0 starts a group.
template <DType T>
__attribute__((target("avx2,fma,f16c"))) void widen_quant(const std::uint8_t* row, std::int64_t k, std::int64_t c0,
                                                          std::int64_t len, float* out) {
  const std::int64_t group = quant_group_size(T);
  const std::uint8_t* params = row + quant_code_bytes(T, k);
  for (std::int64_t g0 = c0; g0 < c0 + len; g0 += group) {
    const std::int64_t g1 = std::min(c0 + len, g0 + group);
    const float s = f16_to_f32(load_u16(params + 4 * (g0 / group))), m = f16_to_f32(load_u16(params + 4 * (g0 / group) + 2));
    const __m256 vs = _mm256_set1_ps(s), vm = _mm256_set1_ps(m);
    float* o = out + (g0 - c0);
    std::int64_t i = g0;
    if constexpr (quant_bits(T) == 8) {
      for (; i + 8 <= g1; i += 8, o += 8) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i));
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), vs, vm));
      }
      for (; i < g1; ++i) *o++ = static_cast<float>(row[i]) * s + m;
    } else {  // two codes a byte, the even element in the low nibble; groups start at even i
      const __m128i low = _mm_set1_epi8(0x0f);
      for (; i + 16 <= g1; i += 16, o += 16) {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i / 2));
        const __m128i q = _mm_unpacklo_epi8(_mm_and_si128(bytes, low), _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), vs, vm));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))), vs, vm));
      }
      for (; i < g1; ++i) *o++ = static_cast<float>((row[i / 2] >> (4 * (i % 2))) & 0xf) * s + m;
    }
  }
}

// sums[i] (lane j) = sum over c < len of w[j * ws + c] * x[i * k + c], for kR weight rows and M
// activation rows: each weight vector is loaded once for the M rows, each x vector once for
// the kR rows.
template <int M>
__attribute__((target("avx2,fma"))) void micro_tile(const float* w, std::int64_t ws, const float* x, std::int64_t k,
                                                    std::int64_t len, __m128 (&sums)[kM]) {
  __m256 acc[M][kR];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < kR; ++j) acc[i][j] = _mm256_setzero_ps();
  std::int64_t c = 0;
  for (; c + 8 <= len; c += 8) {
    __m256 xv[M];
    for (int i = 0; i < M; ++i) xv[i] = _mm256_loadu_ps(x + i * k + c);
    for (int j = 0; j < kR; ++j) {
      const __m256 wv = _mm256_loadu_ps(w + j * ws + c);
      for (int i = 0; i < M; ++i) acc[i][j] = _mm256_fmadd_ps(wv, xv[i], acc[i][j]);
    }
  }
  for (int i = 0; i < M; ++i) sums[i] = hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
  if (c == len) return;
  for (int i = 0; i < M; ++i) {
    alignas(16) float tail[kR] = {};
    for (int j = 0; j < kR; ++j)
      for (std::int64_t t = c; t < len; ++t) tail[j] += w[j * ws + t] * x[i * k + t];
    sums[i] = _mm_add_ps(sums[i], _mm_load_ps(tail));
  }
}

// Activation rows per micro-kernel call from row i of m: threes, but a remainder of one
// becomes two twos (a one-row call loads as many vectors as it multiplies).
int group_rows(std::int64_t i, std::int64_t m) {
  const std::int64_t left = m - i;
  return left == 4 || left == 2 ? 2 : left == 1 ? 1 : 3;
}

// All activation rows against one widened tile (kR rows of w at stride ws, columns [c0, c0 + len)).
void tile_rows(const GemmArgs& a, const float* w, std::int64_t ws, std::int64_t r, int rows, std::int64_t c0,
               std::int64_t len, TilePrefetch<kR>& prefetch) {
  const std::int64_t k = a.w.cols;
  const std::int64_t calls = (a.m + kM - 1) / kM, per_call = (kR * prefetch.lines_per_row + calls - 1) / calls;
  for (std::int64_t i0 = 0; i0 < a.m;) {
    const int mm = group_rows(i0, a.m);
    const float* x = a.x + i0 * k + c0;
    prefetch.issue(per_call);
    __m128 sums[kM];
    if (mm == 3)
      micro_tile<3>(w, ws, x, k, len, sums);
    else if (mm == 2)
      micro_tile<2>(w, ws, x, k, len, sums);
    else
      micro_tile<1>(w, ws, x, k, len, sums);
    for (int i = 0; i < mm; ++i) add_tile_sums(a, i0 + i, r, rows, c0 == 0, sums[i]);
    i0 += mm;
  }
  prefetch.issue_all();
}

template <DType T>
void tiled_rows(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  const std::int64_t k = a.w.cols, rb = row_bytes(T, k), kc = chunk_cols(k);
  const auto* base = static_cast<const std::uint8_t*>(a.w.data);
  // Where column c's bytes start in a stored row (c starts a group in quantized rows).
  auto byte_of = [](std::int64_t c) {
    if constexpr (is_quantized(T)) return c * quant_bits(T) / 8;
    return c * static_cast<std::int64_t>(T == DType::F32 ? 4 : 2);
  };
  float tile[kR * kMaxChunk];
  auto fill = [&](int j, const std::uint8_t* row, std::int64_t c0, std::int64_t len) {
    if constexpr (is_quantized(T))
      widen_quant<T>(row, k, c0, len, tile + j * kc);
    else if constexpr (T == DType::F32)
      std::memcpy(tile + j * kc, reinterpret_cast<const float*>(row) + c0, static_cast<std::size_t>(len) * 4);
    else
      widen_float<T>(row, c0, len, tile + j * kc);
  };
  auto multiply = [&](std::int64_t r, int rows, std::int64_t c0, std::int64_t len, TilePrefetch<kR>& prefetch) {
    tile_rows(a, tile, kc, r, rows, c0, len, prefetch);
  };
  for (std::int64_t b0 = n0; b0 < n1; b0 += kBlockRows)
    walk_tiles<kR>(base, rb, k, kc, b0, std::min(n1, b0 + kBlockRows), byte_of, fill, multiply);
}

}  // namespace

bool gemm_tiled_supported(const GemmArgs& a) { return kSupported && a.compute == DType::F32 && a.m >= 1; }

void gemm_tiled(const GemmArgs& a, std::int64_t n0, std::int64_t n1) {
  switch (a.w.dtype) {
    case DType::F32: return tiled_rows<DType::F32>(a, n0, n1);
    case DType::F16: return tiled_rows<DType::F16>(a, n0, n1);
    case DType::BF16: return tiled_rows<DType::BF16>(a, n0, n1);
    case DType::Q4: return tiled_rows<DType::Q4>(a, n0, n1);
    case DType::Q8: return tiled_rows<DType::Q8>(a, n0, n1);
    case DType::Q4G32: return tiled_rows<DType::Q4G32>(a, n0, n1);
    case DType::Q8G32: return tiled_rows<DType::Q8G32>(a, n0, n1);
  }
}

}  // namespace flexh2o::kernels
