#include "kernels/cpu/gemm_int8_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm_tile_sums.h"
#include "kernels/quantize.h"

namespace flexh2o::kernels {

namespace {

const bool kSupported = cpu_has_avx2_fma_f16c();
// vpdpbusd (AVX-512 VNNI on 256-bit vectors): unsigned x signed bytes summed straight into
// int32, one instruction for vpmaddubsw + vpmaddwd, and no 16-bit saturation to avoid.
const bool kVnni = kSupported && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
// The 512-bit kernel also needs AVX-512 BW (byte shifts and masks) and DQ.
const bool kAvx512 = kVnni && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");

constexpr int kR = 4;  // weight rows per tile: their four sums share one vector
constexpr int kM = 4;  // activation rows per micro-kernel call
constexpr std::int64_t kBlock = kInt8Block;
// Widest chunk of k per tile (64 blocks, a 20 KiB tile).
constexpr std::int64_t kMaxChunk = 2048;
constexpr std::int64_t kTaskRows = 64;

// One block of a tile: the kR rows' codes centred on their range (q - 8 for 4 bits, q - 128 for
// 8), so the products with the rounded activations carry half the weight's span and hence about
// half the rounding error of uncentred codes, and their scales and minimums laid out as the
// reduced sums are (rows 0-3 in both 128-bit halves; the minimum's term in the low half only).
// vpmaddubsw and vpdpbusd multiply unsigned by signed bytes, so the activation codes go in
// offset by 128 (unsigned) and 128 times each row's sum of centred codes comes off again. The
// one exception, 8-bit codes without VNNI: vpmaddubsw would saturate pairs at 2^15 there, so
// their magnitudes are multiplied with the activation codes carrying the codes' signs instead.
struct TileBlock {
  __m256i code[kR];  // centred codes; q8 without VNNI: their magnitudes
  __m256i sign[kR];  // q8 without VNNI: the centred codes, whose signs go onto the activation codes
  __m256i offset;    // 128 * sum of row j's centred codes in lane j < 4 (0 for q8 without VNNI)
  __m256 scale;      // s of rows 0-3, twice
  __m256 min;        // m + centre * s of rows 0-3, then zeros
};

std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Sum of the 32 unsigned bytes of v.
__attribute__((target("avx2"))) inline int byte_sum(__m256i v) {
  const __m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
  const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return static_cast<int>(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1));
}

// Columns [c0, c0 + len) of kR quantized rows into tile blocks (c0 and len multiples of 32).
template <DType T, bool Vnni>
__attribute__((target("avx2,fma,f16c"))) void unpack_tile(const std::uint8_t* const (&rows)[kR], std::int64_t k,
                                                          std::int64_t c0, std::int64_t len, TileBlock* out) {
  constexpr int kCentre = quant_bits(T) == 4 ? 8 : 128;
  constexpr bool kSigned = quant_bits(T) == 8 && !Vnni;
  const std::int64_t group = quant_group_size(T), code_bytes = quant_code_bytes(T, k);
  for (std::int64_t b = 0; b < len / kBlock; ++b) {
    const std::int64_t c = c0 + b * kBlock, g = c / group;
    TileBlock& tb = out[b];
    alignas(32) float s[8] = {}, m[8] = {};
    alignas(32) std::int32_t offset[8] = {};
    for (int j = 0; j < kR; ++j) {
      s[j] = s[j + 4] = f16_to_f32(load_u16(rows[j] + code_bytes + 4 * g));
      m[j] = f16_to_f32(load_u16(rows[j] + code_bytes + 4 * g + 2)) + static_cast<float>(kCentre) * s[j];
      __m256i q;
      if constexpr (quant_bits(T) == 4) {  // two codes a byte, the even element in the low nibble
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + c / 2));
        const __m128i low = _mm_set1_epi8(0x0f);
        const __m128i lo = _mm_and_si128(bytes, low), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
        q = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
      } else {
        q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + c));
      }
      const __m256i centred = _mm256_sub_epi8(q, _mm256_set1_epi8(static_cast<char>(kCentre)));
      if constexpr (kSigned) {
        tb.sign[j] = centred;
        tb.code[j] = _mm256_abs_epi8(centred);  // |-128| reads as 128 unsigned
      } else {
        tb.code[j] = centred;
        offset[j] = 128 * (byte_sum(q) - static_cast<int>(kBlock) * kCentre);
      }
    }
    tb.offset = _mm256_load_si256(reinterpret_cast<const __m256i*>(offset));
    tb.scale = _mm256_load_ps(s);
    tb.min = _mm256_load_ps(m);
  }
}

// The four rows' integer dot products with one block of activation codes, reduced to one
// vector: lanes 0-3 and 4-7 hold rows 0-3's sums over the block's two halves.
template <int Bits>
__attribute__((target("avx2,fma"), always_inline)) inline __m256i block_dots(const TileBlock& tb, __m256i codes) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i offset_codes = _mm256_xor_si256(codes, _mm256_set1_epi8(static_cast<char>(0x80)));  // + 128
  __m256i p[kR];
  for (int j = 0; j < kR; ++j) {
    const __m256i prod = Bits == 8 ? _mm256_maddubs_epi16(tb.code[j], _mm256_sign_epi8(codes, tb.sign[j]))
                                   : _mm256_maddubs_epi16(offset_codes, tb.code[j]);
    p[j] = _mm256_madd_epi16(prod, ones);
  }
  const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  return _mm256_sub_epi32(sums, tb.offset);
}
__attribute__((target("avx2,fma,avx512vnni,avx512vl"), always_inline)) inline __m256i block_dots_vnni(
    const TileBlock& tb, __m256i codes) {
  const __m256i offset_codes = _mm256_xor_si256(codes, _mm256_set1_epi8(static_cast<char>(0x80)));  // + 128
  __m256i p[kR];
  for (int j = 0; j < kR; ++j) p[j] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), offset_codes, tb.code[j]);
  const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  return _mm256_sub_epi32(sums, tb.offset);
}

// acc += one block's integer sums (lanes as block_dots) scaled by s dx, plus m sum(x).
__attribute__((target("avx2,fma"), always_inline)) inline void add_block(__m256& acc, __m256i dots,
                                                                        const TileBlock& tb, const Int8Rows& q,
                                                                        std::int64_t blk) {
  const __m256 scale = _mm256_mul_ps(tb.scale, _mm256_set1_ps(q.scale[blk]));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), scale, acc);
  acc = _mm256_fmadd_ps(tb.min, _mm256_set1_ps(q.sum[blk]), acc);
}

__attribute__((target("avx2"), always_inline)) inline __m256i codes_at(const Int8Rows& q, std::int64_t blk) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.codes.data() + blk * kBlock));
}

__attribute__((target("avx2"), always_inline)) inline __m128 fold(__m256 acc) {
  return _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
}

// M activation rows (from row i0) against a tile of nb blocks starting at block b0 of x. Twice,
// for AVX2 and for VNNI: a function's target cannot depend on a template argument.
template <int Bits, int M>
__attribute__((target("avx2,fma"))) void micro_tile(const TileBlock* tile, std::int64_t nb, const Int8Rows& q,
                                                    std::int64_t i0, std::int64_t b0, __m128 (&sums)[kM]) {
  const std::int64_t blocks = q.k / kBlock;
  __m256 acc[M];
  for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b)
    for (int i = 0; i < M; ++i) {
      const std::int64_t blk = (i0 + i) * blocks + b0 + b;
      add_block(acc[i], block_dots<Bits>(tile[b], codes_at(q, blk)), tile[b], q, blk);
    }
  for (int i = 0; i < M; ++i) sums[i] = fold(acc[i]);
}
template <int Bits, int M>
__attribute__((target("avx2,fma,avx512vnni,avx512vl"))) void micro_tile_vnni(const TileBlock* tile, std::int64_t nb,
                                                                              const Int8Rows& q, std::int64_t i0,
                                                                              std::int64_t b0, __m128 (&sums)[kM]) {
  const std::int64_t blocks = q.k / kBlock;
  __m256 acc[M];
  for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b)
    for (int i = 0; i < M; ++i) {
      const std::int64_t blk = (i0 + i) * blocks + b0 + b;
      add_block(acc[i], block_dots_vnni(tile[b], codes_at(q, blk)), tile[b], q, blk);
    }
  for (int i = 0; i < M; ++i) sums[i] = fold(acc[i]);
}

template <int Bits, int M, bool Vnni>
void micro(const TileBlock* tile, std::int64_t nb, const Int8Rows& q, std::int64_t i0, std::int64_t b0,
           __m128 (&sums)[kM]) {
  if constexpr (Vnni)
    micro_tile_vnni<Bits, M>(tile, nb, q, i0, b0, sums);
  else
    micro_tile<Bits, M>(tile, nb, q, i0, b0, sums);
}

template <int Bits, bool Vnni>
void tile_rows(const GemmArgs& a, const Int8Rows& q, const TileBlock* tile, std::int64_t nb, std::int64_t r,
               int rows, std::int64_t b0) {
  for (std::int64_t i0 = 0; i0 < a.m; i0 += kM) {
    const int mm = static_cast<int>(std::min<std::int64_t>(kM, a.m - i0));
    __m128 sums[kM];
    switch (mm) {
      case 4: micro<Bits, 4, Vnni>(tile, nb, q, i0, b0, sums); break;
      case 3: micro<Bits, 3, Vnni>(tile, nb, q, i0, b0, sums); break;
      case 2: micro<Bits, 2, Vnni>(tile, nb, q, i0, b0, sums); break;
      default: micro<Bits, 1, Vnni>(tile, nb, q, i0, b0, sums); break;
    }
    for (int i = 0; i < mm; ++i) add_tile_sums(a, i0 + i, r, rows, b0 == 0, sums[i]);
  }
}

template <DType T, bool Vnni>
void int8_rows(const GemmArgs& a, const Int8Rows& q, std::int64_t n0, std::int64_t n1) {
  constexpr int kBits = quant_bits(T);
  const std::int64_t k = a.w.cols, rb = row_bytes(T, k), kc = std::min(k, kMaxChunk);
  const auto* base = static_cast<const std::uint8_t*>(a.w.data);
  alignas(32) TileBlock tile[kMaxChunk / kBlock];
  for (std::int64_t t0 = n0; t0 < n1; t0 += kTaskRows) {
    const std::int64_t t1 = std::min(n1, t0 + kTaskRows);
    for (std::int64_t c0 = 0; c0 < k; c0 += kc) {
      const std::int64_t len = std::min(kc, k - c0);
      for (std::int64_t r = t0; r < t1; r += kR) {
        const int rows = static_cast<int>(std::min<std::int64_t>(kR, t1 - r));
        const std::uint8_t* w[kR];  // a short last tile repeats its last row; those sums are dropped
        for (int j = 0; j < kR; ++j) w[j] = base + (r + std::min(j, rows - 1)) * rb;
        unpack_tile<T, Vnni>(w, k, c0, len, tile);
        tile_rows<kBits, Vnni>(a, q, tile, len / kBlock, r, rows, c0 / kBlock);
      }
    }
  }
}

__attribute__((target("avx2,fma"))) inline float hmax(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// One block of 32 values: codes round(x * 127 / max |x|) (to nearest even, as vcvtps2dq does),
// in x's order or its even-indexed values first (even_odd), its scale, its sum and its codes' sum.
__attribute__((target("avx2,fma"))) void quantize_block(const float* x, bool even_odd, std::int8_t* codes,
                                                        float& scale, float& sum, std::int32_t& code_sum) {
  __m256 v[4];
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 amax = _mm256_setzero_ps();
  for (int p = 0; p < 4; ++p) {
    v[p] = _mm256_loadu_ps(x + 8 * p);
    amax = _mm256_max_ps(amax, _mm256_and_ps(v[p], magnitude));
  }
  const float mx = hmax(amax);
  scale = mx / 127.0f;
  sum = hsum(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
  const __m256 inv = _mm256_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
  __m256i c[4];
  for (int p = 0; p < 4; ++p) c[p] = _mm256_cvtps_epi32(_mm256_mul_ps(v[p], inv));
  // Packing works within 128-bit lanes; the permute puts the 4-byte groups back in order.
  __m256i bytes = _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3])),
      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if (even_odd) {  // per 16 values: the 8 even ones, then the 8 odd ones; then the halves' evens first
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    bytes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bytes, split), 0xD8);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), bytes);
  // The codes offset to unsigned bytes, summed, less the offsets.
  code_sum = byte_sum(_mm256_xor_si256(bytes, _mm256_set1_epi8(static_cast<char>(0x80)))) - 128 * 32;
}

template <bool Vnni>
void int8_dispatch(const GemmArgs& a, const Int8Rows& q, std::int64_t n0, std::int64_t n1) {
  switch (a.w.dtype) {
    case DType::Q4: return int8_rows<DType::Q4, Vnni>(a, q, n0, n1);
    case DType::Q8: return int8_rows<DType::Q8, Vnni>(a, q, n0, n1);
    case DType::Q4G32: return int8_rows<DType::Q4G32, Vnni>(a, q, n0, n1);
    case DType::Q8G32: return int8_rows<DType::Q8G32, Vnni>(a, q, n0, n1);
    default: break;
  }
}

}  // namespace

bool gemm_int8_supported(const GemmArgs& a) {
  return kSupported && a.compute == DType::F32 && is_quantized(a.w.dtype) && a.w.cols % kBlock == 0 && a.m >= 1;
}

bool int8_kernel_available(Int8Kernel kernel) {
  switch (kernel) {
    case Int8Kernel::Avx2: return kSupported;
    case Int8Kernel::Vnni256: return kVnni;
    case Int8Kernel::Avx512Vnni: return kAvx512;
  }
  return false;
}

Int8Kernel int8_best_kernel() {
  return kAvx512 ? Int8Kernel::Avx512Vnni : kVnni ? Int8Kernel::Vnni256 : Int8Kernel::Avx2;
}

void resize_int8_rows(std::int64_t m, std::int64_t k, Int8Rows& q, Int8Kernel kernel, DType w) {
  q.m = m;
  q.k = k;
  q.even_odd = kernel == Int8Kernel::Avx512Vnni && quant_bits(w) == 4;
  q.codes.resize(static_cast<std::size_t>(m * k));
  q.scale.resize(static_cast<std::size_t>(m * (k / kBlock)));
  q.sum.resize(q.scale.size());
  q.code_sum.resize(q.scale.size());
}

void quantize_int8_rows(const float* x, std::int64_t i0, std::int64_t i1, Int8Rows& q) {
  const std::int64_t blocks = q.k / kBlock;
  for (std::int64_t i = i0; i < i1; ++i)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t at = i * blocks + b;
      quantize_block(x + i * q.k + b * kBlock, q.even_odd, q.codes.data() + at * kBlock, q.scale[at], q.sum[at],
                     q.code_sum[at]);
    }
}

void gemm_int8(const GemmArgs& a, const Int8Rows& q, std::int64_t n0, std::int64_t n1, Int8Kernel kernel) {
  if (!int8_kernel_available(kernel)) throw std::invalid_argument("gemm_int8: this CPU lacks the kernel's instructions");
  if (q.even_odd != (kernel == Int8Kernel::Avx512Vnni && quant_bits(a.w.dtype) == 4))
    throw std::invalid_argument("gemm_int8: the activations were quantized for another kernel");
  switch (kernel) {
    case Int8Kernel::Avx2: return int8_dispatch<false>(a, q, n0, n1);
    case Int8Kernel::Vnni256: return int8_dispatch<true>(a, q, n0, n1);
    case Int8Kernel::Avx512Vnni: return gemm_int8_avx512(a, q, n0, n1);
  }
}

}  // namespace flexh2o::kernels
