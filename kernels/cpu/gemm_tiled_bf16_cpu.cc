// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -W(maybe-)uninitialized flags
// once inlined (GCC bug 105593); the values are never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "kernels/cpu/gemm_tiled_bf16_cpu.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/float_lanes.h"
#include "kernels/cpu/gemm_tile_walk.h"
#include "kernels/cpu/gemm_tile_sums.h"
#include "kernels/cpu/gemm_tiled_cpu.h"

#define FLEXH2O_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

namespace flexh2o::kernels {

namespace {

const bool kSupported = cpu_has_avx512_bf16();

constexpr int kR = static_cast<int>(kTiledWeightRows);
constexpr int kM = 6;  // activation rows per micro-kernel call: 24 accumulators + 4 w + 1 x = 29 zmm
constexpr int kLanes = 32;  // bf16 values per zmm
// Widest chunk of k: the tile (kR x this bf16, 16 KiB) stays in L1, and a block of kRowBlock
// activation rows' chunk (512 KiB) in L2 while every tile of a task's weight rows reads it.
constexpr std::int64_t kMaxChunk = 2048;
constexpr std::int64_t kRowBlock = 128;

// Columns per chunk: k in equal chunks of at most kMaxChunk, each a multiple of 32 (whole
// vectors but the last). Depends on k alone: it fixes each output's summation order.
std::int64_t chunk_cols(std::int64_t k) { return equal_chunks(k, kMaxChunk, kLanes); }

// A row stride for n bf16 values that is an odd number of cache lines: rows at a multiple of
// 4 KiB apart (k = 2048) would share L1 sets, and a micro-kernel's 4 weight and 6 activation rows
// would then overflow the 8 ways.
constexpr std::int64_t padded_stride(std::int64_t n) { return (((n + kLanes - 1) / kLanes) | 1) * kLanes; }

// len fp16 or fp32 values as bf16, rounded to nearest even. fp16 -> fp32 is exact and never
// subnormal. An fp32 subnormal becomes 0 here and a bf16 subnormal in f32_to_bf16, which
// vdpbf16ps reads as 0 as well: only a weight within 2^-134 of 2^-126 (0 here, 2^-126 there)
// can multiply differently from the oneDNN path.
template <DType T>
FLEXH2O_AVX512_BF16 void widen_to_bf16(const void* row, std::int64_t c0, std::int64_t len, std::uint16_t* out) {
  std::int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    __m512 lo, hi;
    if constexpr (T == DType::F16) {
      const auto* p = static_cast<const std::uint16_t*>(row) + c0 + i;
      lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
    } else {
      const float* p = static_cast<const float*>(row) + c0 + i;
      lo = _mm512_loadu_ps(p);
      hi = _mm512_loadu_ps(p + 16);
    }
    _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
  for (; i < len; ++i) out[i] = f32_to_bf16(stored_float<T>(row, c0 + i));
}

// Lane j of the result = the sum of v[j]'s 16 lanes: the halves added, then hsum4's tree.
FLEXH2O_AVX512_BF16 inline __m128 hsum16x4(const __m512 (&v)[kR]) {
  __m256 h[kR];
  for (int j = 0; j < kR; ++j) h[j] = _mm256_add_ps(_mm512_castps512_ps256(v[j]), _mm512_extractf32x8_ps(v[j], 1));
  return hsum4(h[0], h[1], h[2], h[3]);
}

FLEXH2O_AVX512_BF16 inline __m512bh load_bh(const std::uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}
FLEXH2O_AVX512_BF16 inline __m512bh load_bh(const std::uint16_t* p, __mmask32 mask) {
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, p));
}

// acc[i][j] += the products of one vector of columns (from c) of weight row j and activation row
// i; Masked loads only the columns in mask (zeros elsewhere).
template <int M, bool Masked>
FLEXH2O_AVX512_BF16 inline void dot_step(const std::uint16_t* w, std::int64_t ws, const std::uint16_t* x,
                                         std::int64_t xs, std::int64_t c, __mmask32 mask, __m512 (&acc)[M][kR]) {
  __m512bh wv[kR];
  for (int j = 0; j < kR; ++j) wv[j] = Masked ? load_bh(w + j * ws + c, mask) : load_bh(w + j * ws + c);
  for (int i = 0; i < M; ++i) {
    const __m512bh xv = Masked ? load_bh(x + i * xs + c, mask) : load_bh(x + i * xs + c);
    for (int j = 0; j < kR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[j], xv);
  }
}

// sums[i] (lane j) = sum over c < len of w[j * ws + c] * x[i * xs + c] for kR weight rows and M
// activation rows, all bf16: 16 lanes of pairs, then the lanes in a fixed tree.
template <int M>
FLEXH2O_AVX512_BF16 void micro_tile(const std::uint16_t* w, std::int64_t ws, const std::uint16_t* x, std::int64_t xs,
                                    std::int64_t len, __m128 (&sums)[kM]) {
  __m512 acc[M][kR];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < kR; ++j) acc[i][j] = _mm512_setzero_ps();
  std::int64_t c = 0;
  for (; c + kLanes <= len; c += kLanes) dot_step<M, false>(w, ws, x, xs, c, 0, acc);
  if (c < len) dot_step<M, true>(w, ws, x, xs, c, _cvtu32_mask32((1u << (len - c)) - 1u), acc);
  for (int i = 0; i < M; ++i) sums[i] = hsum16x4(acc[i]);
}

// Activation rows per micro-kernel call from row i of m: sixes, the remainder in one call.
int group_rows(std::int64_t i, std::int64_t m) { return static_cast<int>(std::min<std::int64_t>(kM, m - i)); }

template <int M>
void call_micro_tile(const std::uint16_t* w, std::int64_t ws, const std::uint16_t* x, std::int64_t xs, std::int64_t len,
                     int mm, __m128 (&sums)[kM]) {
  if constexpr (M > 1) {
    if (mm < M) return call_micro_tile<M - 1>(w, ws, x, xs, len, mm, sums);
  }
  micro_tile<M>(w, ws, x, xs, len, sums);
}

// Activation rows [m0, m1) against one tile (kR rows of w at stride ws, columns [c0, c0 + len)).
void tile_rows(const GemmArgs& a, const std::uint16_t* x, std::int64_t m0, std::int64_t m1, const std::uint16_t* w,
               std::int64_t ws, std::int64_t r, int rows, std::int64_t c0, std::int64_t len, TilePrefetch<kR>& prefetch) {
  const std::int64_t xs = tiled_bf16_x_stride(a.w.cols);
  const std::int64_t calls = (m1 - m0 + kM - 1) / kM, per_call = (kR * prefetch.lines_per_row + calls - 1) / calls;
  for (std::int64_t i0 = m0; i0 < m1;) {
    const int mm = group_rows(i0, m1);
    prefetch.issue(per_call);
    __m128 sums[kM];
    call_micro_tile<kM>(w, ws, x + i0 * xs + c0, xs, len, mm, sums);
    for (int i = 0; i < mm; ++i) add_tile_sums(a, i0 + i, r, rows, c0 == 0, sums[i]);
    i0 += mm;
  }
  prefetch.issue_all();
}

// Activation rows [m0, m1) by weight rows [b0, b1): chunk by chunk of k, tile by tile.
template <DType T>
void tiled_block(const GemmArgs& a, const std::uint16_t* x, std::int64_t m0, std::int64_t m1, std::int64_t b0,
                 std::int64_t b1, std::uint16_t* tile) {
  const std::int64_t k = a.w.cols, kc = chunk_cols(k), ts = padded_stride(kc);
  const std::int64_t es = T == DType::F32 ? 4 : 2;  // bytes per stored value
  auto fill = [&](int j, const std::uint8_t* row, std::int64_t c0, std::int64_t len) {
    if constexpr (T == DType::BF16)
      std::memcpy(tile + j * ts, row + 2 * c0, static_cast<std::size_t>(len) * 2);
    else
      widen_to_bf16<T>(row, c0, len, tile + j * ts);
  };
  auto multiply = [&](std::int64_t r, int rows, std::int64_t c0, std::int64_t len, TilePrefetch<kR>& prefetch) {
    tile_rows(a, x, m0, m1, tile, ts, r, rows, c0, len, prefetch);
  };
  walk_tiles<kR>(static_cast<const std::uint8_t*>(a.w.data), es * k, k, kc, b0, b1,
                 [es](std::int64_t c) { return es * c; }, fill, multiply);
}

// Blocks of kRowBlock activation rows (their chunk of x stays in L2), each by every block of
// kTiledTaskRows weight rows. Every output still sums its chunks in order, so the blocking over
// rows leaves a row's bits the same whatever the number of rows.
template <DType T>
void tiled_rows(const GemmArgs& a, const std::uint16_t* x, std::int64_t n0, std::int64_t n1) {
  alignas(64) std::uint16_t tile[kR * padded_stride(kMaxChunk)];
  for (std::int64_t m0 = 0; m0 < a.m; m0 += kRowBlock)
    for (std::int64_t b0 = n0; b0 < n1; b0 += kTiledTaskRows)
      tiled_block<T>(a, x, m0, std::min(a.m, m0 + kRowBlock), b0, std::min(n1, b0 + kTiledTaskRows), tile);
}

}  // namespace

std::int64_t tiled_bf16_x_stride(std::int64_t k) { return padded_stride(k); }

bool gemm_tiled_bf16_supported(const GemmArgs& a) {
  const DType t = a.w.dtype;
  return kSupported && a.compute == DType::BF16 && (t == DType::F32 || t == DType::F16 || t == DType::BF16) && a.m >= 1;
}

void gemm_tiled_bf16(const GemmArgs& a, const std::uint16_t* x_bf16, std::int64_t n0, std::int64_t n1) {
  switch (a.w.dtype) {
    case DType::F32: return tiled_rows<DType::F32>(a, x_bf16, n0, n1);
    case DType::F16: return tiled_rows<DType::F16>(a, x_bf16, n0, n1);
    case DType::BF16: return tiled_rows<DType::BF16>(a, x_bf16, n0, n1);
    default: throw std::invalid_argument("gemm_tiled_bf16: weights must be f32, f16 or bf16");
  }
}

}  // namespace flexh2o::kernels
