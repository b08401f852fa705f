// The AVX-512 VNNI kernel of gemm_int8 (gemm_int8_cpu.h): the same sums as the AVX2 kernel,
//   s * dx * sum over the block of (q - centre) * code  +  (m + centre * s) * sum(x)
// per weight group and activation block, laid out so that no sum is ever horizontal.
//
// A tile of 32 weight rows is unpacked once per call over the whole of k into blocks of
// 2 x 8 vectors: vector (h, g) holds codes 4g..4g+3 of the block of rows 16h..16h+15, one row
// per 32-bit lane, as unsigned bytes (the stored codes q). 4-bit rows are unpacked as their 16
// low nibbles (the even-indexed values) then their 16 high nibbles, so their activations are
// quantized in that order (Int8Rows::even_odd). For each activation row, vpdpbusd multiplies
// vector (h, g) with that row's codes 4g..4g+3 broadcast to every lane: after the 8 groups,
// lane j holds sum(q * code) of row 16h + j, exactly in int32. The accumulator starts from
// -centre * sum(code), so it ends at sum((q - centre) * code) (the centred products the error
// bound of gemm_int8_cpu.h is about), and one FMA per block adds it, scaled by s * dx, into the
// row's fp32 sum, another the minimum's term. Four activation rows share each loaded vector.
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -W(maybe-)uninitialized flags
// once inlined (GCC bug 105593); the values are never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm_int8_cpu.h"
#include "kernels/quantize.h"

#define FLEXH2O_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma")))

namespace flexh2o::kernels {

namespace {

constexpr int kLanes = 16;  // weight rows per vector
constexpr int kHalves = static_cast<int>(kInt8Avx512TileRows) / kLanes;
constexpr int kGroups = static_cast<int>(kInt8Block) / 4;  // 4-code groups per block
constexpr int kM = 4;                                      // activation rows per micro-kernel call

// One block of a 32-row tile.
struct alignas(64) TileBlock {
  __m512i code[kHalves][kGroups];  // lane j of (h, g): codes 4g..4g+3 of row 16h + j
  __m512 scale[kHalves];           // s of row 16h + j
  __m512 min[kHalves];             // m + centre * s of row 16h + j
};

// Rows 16h..16h+15 of one block as 8 vectors A_j = [row j's 32 codes | row j + 8's], then
// transposed per 256-bit half (an 8 x 8 transpose of 32-bit groups) into code[h][g].
template <int Bits>
FLEXH2O_AVX512 void unpack_codes(const std::uint8_t* const* rows, std::int64_t b, __m512i (&out)[kGroups]) {
  __m512i r[8];
  for (int j = 0; j < 8; ++j) {
    if constexpr (Bits == 4) {  // [bytes j, bytes j, bytes j+8, bytes j+8], odd 128-bit lanes shifted to the high nibbles
      const auto* lo = reinterpret_cast<const __m128i*>(rows[j] + 16 * b);
      const auto* hi = reinterpret_cast<const __m128i*>(rows[j + 8] + 16 * b);
      const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128(lo))),
                                           _mm256_broadcastsi128_si256(_mm_loadu_si128(hi)), 1);
      r[j] = _mm512_and_si512(_mm512_mask_srli_epi16(x, 0xFF00FF00u, x, 4), _mm512_set1_epi8(0x0f));
    } else {
      const auto* lo = reinterpret_cast<const __m256i*>(rows[j] + 32 * b);
      const auto* hi = reinterpret_cast<const __m256i*>(rows[j + 8] + 32 * b);
      r[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(lo)), _mm256_loadu_si256(hi), 1);
    }
  }
  __m512i t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
  }
  for (int p = 0; p < 2; ++p) {  // u[4p + c]: groups c (low 128 bits) and c + 4 (high) of rows 4p..4p+3
    u[4 * p + 0] = _mm512_unpacklo_epi64(t[4 * p], t[4 * p + 2]);
    u[4 * p + 1] = _mm512_unpackhi_epi64(t[4 * p], t[4 * p + 2]);
    u[4 * p + 2] = _mm512_unpacklo_epi64(t[4 * p + 1], t[4 * p + 3]);
    u[4 * p + 3] = _mm512_unpackhi_epi64(t[4 * p + 1], t[4 * p + 3]);
  }
  const __m512i low = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), high = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int c = 0; c < 4; ++c) {
    out[c] = _mm512_permutex2var_epi64(u[c], low, u[4 + c]);
    out[c + 4] = _mm512_permutex2var_epi64(u[c], high, u[4 + c]);
  }
}

// Every block of a tile of 32 rows (a short tile repeats its last row).
template <DType T>
FLEXH2O_AVX512 void unpack_tile(const std::uint8_t* const (&rows)[kInt8Avx512TileRows], std::int64_t k,
                                TileBlock* tile) {
  constexpr int kBits = quant_bits(T);
  const __m512 centre = _mm512_set1_ps(kBits == 4 ? 8.0f : 128.0f);
  const std::int64_t group = quant_group_size(T), params = quant_code_bytes(T, k);
  __m512i offsets[kHalves];  // of each row's bytes from the half's first row, for the gathers
  for (int h = 0; h < kHalves; ++h) {
    alignas(64) std::int32_t o[kLanes];
    for (int j = 0; j < kLanes; ++j) o[j] = static_cast<std::int32_t>(rows[h * kLanes + j] - rows[h * kLanes]);
    offsets[h] = _mm512_load_si512(o);
  }
  for (std::int64_t b = 0; b < k / kInt8Block; ++b) {
    TileBlock& tb = tile[b];
    const std::int64_t g = b * kInt8Block / group;
    for (int h = 0; h < kHalves; ++h) {
      const std::uint8_t* const* half = rows + h * kLanes;
      unpack_codes<kBits>(half, b, tb.code[h]);
      // (s, m) of every row as one 32-bit pair: s in the low half.
      const __m512i sm = _mm512_i32gather_epi32(offsets[h], half[0] + params + 4 * g, 1);
      const __m512 s = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(sm));
      tb.scale[h] = s;
      tb.min[h] = _mm512_fmadd_ps(centre, s, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(sm, 16))));
    }
  }
}

std::int32_t load_i32(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// acc[i][h], lane j = the dot product of activation row i0 + i with tile row 16h + j.
template <int M>
FLEXH2O_AVX512 void micro_tile(const TileBlock* tile, std::int64_t nb, const Int8Rows& q, std::int64_t i0,
                               std::int32_t centre, __m512 (&acc)[kM][kHalves]) {
  const std::int64_t blocks = q.k / kInt8Block;
  for (int i = 0; i < M; ++i)
    for (int h = 0; h < kHalves; ++h) acc[i][h] = _mm512_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const TileBlock& tb = tile[b];
    __m512i dot[M][kHalves];
    const std::int8_t* codes[M];
    for (int i = 0; i < M; ++i) {
      const std::int64_t blk = (i0 + i) * blocks + b;
      codes[i] = q.codes.data() + blk * kInt8Block;
      for (int h = 0; h < kHalves; ++h) dot[i][h] = _mm512_set1_epi32(-centre * q.code_sum[blk]);
    }
    for (int g = 0; g < kGroups; ++g) {
      __m512i w[kHalves];
      for (int h = 0; h < kHalves; ++h) w[h] = _mm512_load_si512(&tb.code[h][g]);
      for (int i = 0; i < M; ++i) {
        const __m512i x = _mm512_set1_epi32(load_i32(codes[i] + 4 * g));
        for (int h = 0; h < kHalves; ++h) dot[i][h] = _mm512_dpbusd_epi32(dot[i][h], w[h], x);
      }
    }
    for (int i = 0; i < M; ++i) {
      const std::int64_t blk = (i0 + i) * blocks + b;
      const __m512 dx = _mm512_set1_ps(q.scale[blk]), sum = _mm512_set1_ps(q.sum[blk]);
      for (int h = 0; h < kHalves; ++h) {
        acc[i][h] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot[i][h]), dx), tb.scale[h], acc[i][h]);
        acc[i][h] = _mm512_fmadd_ps(tb.min[h], sum, acc[i][h]);
      }
    }
  }
}

// y[i0 + i, r + 16h + j] for the tile's first `rows` rows: the sums, plus the bias and y.
FLEXH2O_AVX512 void store_rows(const GemmArgs& a, std::int64_t i0, int mm, std::int64_t r, int rows,
                               const __m512 (&acc)[kM][kHalves]) {
  for (int h = 0; h < kHalves; ++h) {
    const int valid = std::clamp(rows - h * kLanes, 0, kLanes);
    if (valid == 0) continue;
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const std::int64_t col = r + h * kLanes;
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mask, a.bias + col) : _mm512_setzero_ps();
    for (int i = 0; i < mm; ++i) {
      float* y = a.y + (i0 + i) * a.w.rows + col;
      __m512 v = a.bias ? _mm512_add_ps(acc[i][h], bias) : acc[i][h];
      if (a.beta != 0.0f) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), v);
      _mm512_mask_storeu_ps(y, mask, v);
    }
  }
}

template <DType T>
FLEXH2O_AVX512 void avx512_rows(const GemmArgs& a, const Int8Rows& q, std::int64_t n0, std::int64_t n1) {
  const std::int64_t k = a.w.cols, nb = k / kInt8Block, rb = row_bytes(T, k);
  const std::int32_t centre = quant_bits(T) == 4 ? 8 : 128;
  const auto* base = static_cast<const std::uint8_t*>(a.w.data);
  // One tile per thread, reused across calls; nothing inside a task runs another GEMM.
  thread_local std::vector<TileBlock> tile;
  tile.resize(static_cast<std::size_t>(nb));
  for (std::int64_t r = n0; r < n1; r += kInt8Avx512TileRows) {
    const int rows = static_cast<int>(std::min(kInt8Avx512TileRows, n1 - r));
    const std::uint8_t* w[kInt8Avx512TileRows];
    for (int j = 0; j < kInt8Avx512TileRows; ++j) w[j] = base + (r + std::min(j, rows - 1)) * rb;
    unpack_tile<T>(w, k, tile.data());
    for (std::int64_t i0 = 0; i0 < a.m; i0 += kM) {
      const int mm = static_cast<int>(std::min<std::int64_t>(kM, a.m - i0));
      __m512 acc[kM][kHalves];
      switch (mm) {
        case 4: micro_tile<4>(tile.data(), nb, q, i0, centre, acc); break;
        case 3: micro_tile<3>(tile.data(), nb, q, i0, centre, acc); break;
        case 2: micro_tile<2>(tile.data(), nb, q, i0, centre, acc); break;
        default: micro_tile<1>(tile.data(), nb, q, i0, centre, acc); break;
      }
      store_rows(a, i0, mm, r, rows, acc);
    }
  }
}

}  // namespace

void gemm_int8_avx512(const GemmArgs& a, const Int8Rows& q, std::int64_t n0, std::int64_t n1) {
  switch (a.w.dtype) {
    case DType::Q4: return avx512_rows<DType::Q4>(a, q, n0, n1);
    case DType::Q8: return avx512_rows<DType::Q8>(a, q, n0, n1);
    case DType::Q4G32: return avx512_rows<DType::Q4G32>(a, q, n0, n1);
    case DType::Q8G32: return avx512_rows<DType::Q8G32>(a, q, n0, n1);
    default: break;
  }
}

}  // namespace flexh2o::kernels
