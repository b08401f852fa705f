// Prefill attention on tensor cores, FlashAttention-2 style, for bf16 compute
// (docs/backends.md, "Prefill attention on tensor cores").
//
// A block of 4 warps per (tile of 64 query rows of one sequence, query head h); a warp owns 16
// rows. The block stores its queries in shared memory as bf16 once, then streams the keys and
// values its rows see (causal, within the sliding window) of kv head h / group through shared
// memory, Bc at a time, rounded to bf16 as they are stored. They come either from the step's
// fp32 rows (a whole prompt) or, for a prompt continued after cached tokens (decode queries on
// one cache row, decode_runs.h), in place from the f16/bf16 cache row, the tile's first query at
// slot position i0 and each next one a slot further: causal with an offset. Per key tile a warp
//   - computes its 16 x Bc scores S = Q K^T with mma.sync m16n8k16 (bf16 in, fp32 accumulators),
//   - scales (and soft-caps) them into log2 units, so that exp is one exp2, and masks them,
//   - updates its rows' online softmax in fp32 registers: running max m and sum l of the
//     unrounded exp2(x - m), the output accumulators rescaled by exp2(m_old - m_new),
//   - rounds the probabilities to bf16 and adds P V to its fp32 output accumulators.
// The accumulators of S are laid out as the A operand of P V, so P never leaves registers.
// At the end the output rows are o / l, written in fp32.
//
// Inline PTX (mma.sync, ldmatrix) rather than nvcuda::wmma: the softmax must know which row and
// key each accumulator element holds, which the PTX ISA specifies for mma.sync fragments and
// wmma leaves opaque (its fragments would have to pass through shared memory).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"),
// lane = 4 grp + tig:
//   A 16 x 16 (row-major), 4 registers of 2 bf16: (row grp, cols 2 tig + {0, 1}), (grp + 8, same),
//     (grp, 2 tig + 8 + {0, 1}), (grp + 8, same); the lower column in the low half.
//   B 16 x 8 (k x n), 2 registers: (rows 2 tig + {0, 1}, col grp), (rows 2 tig + 8 + {0, 1}, grp).
//   C 16 x 8 fp32, 4 floats: (row grp, cols 2 tig + {0, 1}), (row grp + 8, same).
// ldmatrix .x4 loads four 8 x 8 matrices, matrix i from the 8 row addresses of lanes 8 i .. 8 i + 7,
// into register i: lane l gets (row l / 4, cols 2 (l % 4) + {0, 1}), with .trans the transpose
// (rows 2 (l % 4) + {0, 1}, col l / 4).
#include "kernels/cuda/attention_prefill_mma.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_common.cuh"

namespace flexh2o::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMmaThreads = 32 * kWarps;
constexpr int kRowsPerWarp = 16;  // the M of m16n8k16
static_assert(kMmaQueryTile == kWarps * kRowsPerWarp, "a warp per 16 query rows");
constexpr float kLog2e = 1.44269504088896341f;

// Keys per shared-memory tile: 64, or 32 at head_dim 256, where a lane's 16 x 256 / 32 output
// accumulators leave too few of its 255 registers for 16 x 64 / 32 scores.
template <int D>
__host__ __device__ constexpr int key_tile() {
  return D <= 128 ? 64 : 32;
}
// Blocks an SM must be able to keep resident, which caps a thread's registers at
// 65536 / (128 x blocks): 3 (168 registers) up to head_dim 96, which fits there without spills
// (ptxas -v); larger head dims need up to 255 (2 blocks, as their registers allow anyway).
template <int D>
__host__ __device__ constexpr int min_blocks() {
  return D <= 96 ? 3 : 1;
}
// bf16 elements per shared-memory row: the 16 bytes of padding put the 8 rows one ldmatrix
// matrix reads in distinct banks (for every head dim here).
template <int D>
__host__ __device__ constexpr int pitch() {
  return D + 8;
}
// Q [kMmaQueryTile][pitch], then K and V [key_tile][pitch].
template <int D>
constexpr std::size_t shared_bytes() {
  return static_cast<std::size_t>(kMmaQueryTile + 2 * key_tile<D>()) * pitch<D>() * sizeof(__nv_bfloat16);
}

struct Params {
  const float* q = nullptr;
  const void* k = nullptr;  // the step's fp32 rows, or an f16/bf16 cache
  const void* v = nullptr;
  float* out = nullptr;
  // Prefill: (first row, sequence) per tile and the seq_offsets; cache runs: RunTile per tile.
  const std::int64_t* tiles = nullptr;
  const std::int64_t* offsets = nullptr;
  std::int64_t n_tiles = 0, H = 0, Hkv = 0, window = 0, capacity = 0;
  // A score in log2 units is score_scale * (q . k) without a soft-cap, and
  // cap_log2 * tanh(score_scale * (q . k)) with one (cap_log2 = cap * log2(e), 0 without).
  float score_scale = 0.0f, cap_log2 = 0.0f;
};

// The first key a query at position p sees under a sliding window (0 without one).
__device__ __forceinline__ std::int64_t first_visible(std::int64_t p, std::int64_t window) {
  return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// c += a b: a 16 x 16 and b 16 x 8 in bf16, c 16 x 8 in fp32.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (to nearest even, as kernels::f32_to_bf16), `lo` in the low half.
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return static_cast<std::uint32_t>(__bfloat16_as_ushort(v.x)) |
         (static_cast<std::uint32_t>(__bfloat16_as_ushort(v.y)) << 16);
}

// A half's bits (f16) widened exactly to fp32.
__device__ __forceinline__ float f16_bits_to_float(unsigned bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// 16 loaded bytes of T stored at dst as bf16: 4 fp32 values rounded (8 bytes), 8 f16 values
// widened and rounded, 8 bf16 values as they are (16 bytes).
template <class T>
__device__ __forceinline__ void store_as_bf16(__nv_bfloat16* dst, uint4 x) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16(__uint_as_float(x.x), __uint_as_float(x.y)),
                                                pack_bf16(__uint_as_float(x.z), __uint_as_float(x.w)));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *reinterpret_cast<uint4*>(dst) = x;
  } else {
    static_assert(std::is_same_v<T, __half>, "fp32, f16 or bf16");
    const unsigned w[4] = {x.x, x.y, x.z, x.w};
    unsigned o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = pack_bf16(f16_bits_to_float(w[i] & 0xffffu), f16_bits_to_float(w[i] >> 16));
    *reinterpret_cast<uint4*>(dst) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// Rows [0, count) of a tile of `Rows` rows of D values of T (row r at src + r * stride) into the
// bf16 tile dst [Rows][pitch]; rows [count, Rows) become zeros, so a masked key's value (times
// probability 0) adds 0 where leftover bits could add NaN. 16-byte loads, kBatch in flight; the
// batches are a loop (not unrolled) so that their addresses are not kept across key tiles.
template <int D, int Rows, class T>
__device__ __forceinline__ void load_rows(__nv_bfloat16* dst, const T* src, std::int64_t stride, int count) {
  constexpr int kPerLoad = 16 / static_cast<int>(sizeof(T)), kChunks = D / kPerLoad;  // 16-byte loads per row
  static_assert(D % kPerLoad == 0, "whole 16-byte loads");
  static_assert(Rows * kChunks % kMmaThreads == 0, "every thread loads the same number of chunks");
  constexpr int kIters = Rows * kChunks / kMmaThreads;
  constexpr int kBatch = kIters % 4 == 0 ? 4 : (kIters % 2 == 0 ? 2 : 1);
  const int t = static_cast<int>(threadIdx.x);
#pragma unroll 1
  for (int i0 = 0; i0 < kIters; i0 += kBatch) {
    uint4 x[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int e = t + (i0 + i) * kMmaThreads, r = e / kChunks, c = e % kChunks;
      x[i] = r < count ? __ldg(reinterpret_cast<const uint4*>(src + r * stride) + c) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int e = t + (i0 + i) * kMmaThreads, r = e / kChunks, c = e % kChunks;
      store_as_bf16<T>(dst + r * pitch<D>() + kPerLoad * c, x[i]);
    }
  }
}

// Asks L2 for rows [0, count) of D values of T (row r at src + r * stride) ahead of their load:
// a 128-byte line at every 128 bytes of a row and at its last value covers every line it touches.
template <int D, class T>
__device__ __forceinline__ void prefetch_rows(const T* src, std::int64_t stride, int count) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * D, kPoints = kBytes / 128 + 1;
  for (int e = static_cast<int>(threadIdx.x); e < count * kPoints; e += kMmaThreads) {
    const int r = e / kPoints, offset = min(128 * (e % kPoints), kBytes - 4);
    asm volatile("prefetch.L2 [%0];\n" ::"l"(reinterpret_cast<const char*>(src + r * stride) + offset));
  }
}

// A warp's 16 query rows: lane 4 grp + tig holds rows grp and grp + 8 (ri = 0, 1) of the fp32
// output accumulators (o[dt][2 ri + {0, 1}]: columns 8 dt + 2 tig + {0, 1}), the rows' running
// max m of the scores seen (log2 units, -inf before the first visible key) and its own part l of
// the rows' sums of exp2(score - m) (over the keys whose scores it holds).
template <int D>
struct RowState {
  float o[D / 8][4];
  float m[2], l[2];
};

template <int D>
__device__ __forceinline__ void start_rows(RowState<D>& st) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int c = 0; c < 4; ++c) st.o[dt][c] = 0.0f;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    st.m[ri] = -INFINITY;
    st.l[ri] = 0.0f;
  }
}

// s = Q K^T of the warp's 16 rows and the tile's Bc keys: n-tile nt holds keys 8 nt .. 8 nt + 7.
template <int D, int Bc>
__device__ __forceinline__ void tile_scores(float (&s)[Bc / 8][4], const __nv_bfloat16* q_sh,
                                            const __nv_bfloat16* k_sh, int warp, int lane) {
  constexpr int P = pitch<D>();
  // A of rows 16 warp + (0..15) x dims 16 kd + (0..15): lane l addresses row l % 16 at dim 8 (l / 16).
  const std::uint32_t q_addr = shared_address(q_sh + (warp * kRowsPerWarp + (lane & 15)) * P + (lane >> 4) * 8);
  // B of n-tiles 2 np, 2 np + 1 (keys 16 np + (0..15)) x dims 16 kd + (0..15): matrices (keys 0-7,
  // dims 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15): lane l addresses key 8 (l / 16) + l % 8 at
  // dim 8 ((l / 8) % 2).
  const std::uint32_t k_addr = shared_address(k_sh + ((lane >> 4) * 8 + (lane & 7)) * P + ((lane >> 3) & 1) * 8);
#pragma unroll
  for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) s[nt][c] = 0.0f;
#pragma unroll
  for (int kd = 0; kd < D / 16; ++kd) {
    std::uint32_t a[4];
    ldmatrix_x4(a, q_addr + kd * 16 * sizeof(__nv_bfloat16));
#pragma unroll
    for (int np = 0; np < Bc / 16; ++np) {
      std::uint32_t b[4];
      ldmatrix_x4(b, k_addr + (np * 16 * P + kd * 16) * sizeof(__nv_bfloat16));
      mma_bf16(s[2 * np], a, b[0], b[1]);
      mma_bf16(s[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// Scores into log2 units (scaled, soft-capped). With `mask`, -inf where the key is not visible:
// element c of n-tile nt is key j0 + 8 nt + 2 tig + c % 2 of row w0 + grp + 8 (c / 2), which sees
// it when first_visible(row) <= key <= row and row <= w1 (the warp's last row). Positions within
// a sequence fit in int: its T^2 scores per head could not be computed otherwise.
template <int Bc>
__device__ __forceinline__ void scale_and_mask(float (&s)[Bc / 8][4], const Params& p, bool mask, int j0, int w0,
                                               int w1, int lane) {
  const int grp = lane >> 2, tig = lane & 3;
  int lo[2], hi[2];  // the keys row grp + 8 ri sees: [lo, hi] (empty for a row past w1)
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int row = w0 + grp + 8 * ri;
    lo[ri] = static_cast<int>(first_visible(row, p.window));
    hi[ri] = row <= w1 ? row : -1;
  }
  if (p.cap_log2 == 0.0f) {
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[nt][c] *= p.score_scale;
  } else {
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[nt][c] = p.cap_log2 * tanhf(s[nt][c] * p.score_scale);
  }
  if (!mask) return;
#pragma unroll
  for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int key = j0 + 8 * nt + 2 * tig + (c & 1);
      if (key < lo[c >> 1] || key > hi[c >> 1]) s[nt][c] = -INFINITY;
    }
}

// The online-softmax step of a tile: s (log2 units) becomes exp2(s - m_new) per row, and m, l and
// the output accumulators of each row follow the new maximum. The 4 lanes of a quad hold a row's
// keys between them, so its maximum is reduced over the quad.
template <int D, int Bc>
__device__ __forceinline__ void online_softmax(float (&s)[Bc / 8][4], RowState<D>& st) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float m_new = st.m[ri];
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) m_new = fmaxf(m_new, fmaxf(s[nt][2 * ri], s[nt][2 * ri + 1]));
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
    // A row that has seen no visible key yet (m_new = -inf) subtracts 0: its weights stay 0, not NaN.
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = exp2f(st.m[ri] - base);  // 0 before the row's first visible key
    st.m[ri] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
      for (int c = 2 * ri; c < 2 * ri + 2; ++c) {
        s[nt][c] = exp2f(s[nt][c] - base);
        sum += s[nt][c];
      }
    st.l[ri] = st.l[ri] * alpha + sum;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      st.o[dt][2 * ri] *= alpha;
      st.o[dt][2 * ri + 1] *= alpha;
    }
  }
}

// o += P V over the tile's Bc keys, P the weights of online_softmax rounded to bf16.
template <int D, int Bc>
__device__ __forceinline__ void accumulate_pv(const float (&s)[Bc / 8][4], const __nv_bfloat16* v_sh, RowState<D>& st,
                                              int lane) {
  constexpr int P = pitch<D>();
  // B of keys 16 kk + (0..15) x dim n-tiles 2 dp, 2 dp + 1, from V [key][dim] transposed: matrices
  // (keys 0-7, dims 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): lane l addresses key
  // 8 ((l / 8) % 2) + l % 8 at dim 8 (l / 16).
  const std::uint32_t v_addr = shared_address(v_sh + (((lane >> 3) & 1) * 8 + (lane & 7)) * P + (lane >> 4) * 8);
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) {
    // The accumulators of n-tiles 2 kk and 2 kk + 1 are the A fragment of keys 16 kk + (0..15).
    const std::uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, v_addr + (kk * 16 * P + dp * 16) * sizeof(__nv_bfloat16));
      mma_bf16(st.o[2 * dp], a, b[0], b[1]);
      mma_bf16(st.o[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// Writes the warp's first `rows` rows, o / l, to out (its first row; rows `stride` floats apart).
template <int D>
__device__ __forceinline__ void store_rows(const RowState<D>& st, float* out, std::int64_t stride, std::int64_t rows,
                                           int lane) {
  const int grp = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float l = st.l[ri];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = grp + 8 * ri;
    if (r >= rows) continue;
    const float inv = 1.0f / l;  // l >= 1: the row's largest score adds exp2(m - m)
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<float2*>(out + r * stride + 8 * dt + 2 * tig) =
          make_float2(st.o[dt][2 * ri] * inv, st.o[dt][2 * ri + 1] * inv);
  }
}

// A task's query rows and the keys they read: rows [row0, row0 + rows) of q and out, the first
// at position i0 (it sees keys up to i0, the next row one more); key j of kv head g at element
// kv_offset + j * kv_stride of k and v.
struct TileRows {
  std::int64_t row0 = 0, rows = 0, i0 = 0, kv_offset = 0, kv_stride = 0;
};

// Prefill (fp32 rows): tile = (first row, sequence), positions and keys within the sequence.
// Cache runs (f16/bf16): tile = RunTile (first query, rows, cache row, position of the first),
// keys the cache row's slots of kv head g.
template <int D, class T>
__device__ __forceinline__ TileRows tile_rows(const Params& p, std::int64_t tile, std::int64_t g) {
  if constexpr (std::is_same_v<T, float>) {
    const std::int64_t r0 = p.tiles[2 * tile], b = p.tiles[2 * tile + 1], t0 = p.offsets[b];
    const std::int64_t kv_stride = p.Hkv * D;
    return {r0, min(p.offsets[b + 1] - r0, kMmaQueryTile), r0 - t0, t0 * kv_stride + g * D, kv_stride};
  } else {
    const std::int64_t* t = p.tiles + 4 * tile;
    return {t[0], t[1], t[3], (t[2] * p.Hkv + g) * p.capacity * D, D};
  }
}

// Block per (query tile, query head): tiles of one head are neighbours in the grid, so the
// blocks that run together read the same K/V rows (from L2). T: the keys' and values' type.
template <int D, class T>
__global__ void __launch_bounds__(kMmaThreads, min_blocks<D>()) prefill_mma_kernel(const Params p) {
  constexpr int Bc = key_tile<D>(), P = pitch<D>();
  extern __shared__ __align__(16) unsigned char shared[];
  auto* q_sh = reinterpret_cast<__nv_bfloat16*>(shared);  // [kMmaQueryTile][P]
  __nv_bfloat16* k_sh = q_sh + kMmaQueryTile * P;        // [Bc][P]
  __nv_bfloat16* v_sh = k_sh + Bc * P;                   // [Bc][P]
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const std::int64_t q_stride = p.H * D, group = p.H / p.Hkv;
  for (std::int64_t task = blockIdx.x; task < p.n_tiles * p.H; task += gridDim.x) {
    const std::int64_t h = task / p.n_tiles, tile = task % p.n_tiles;
    const TileRows tr = tile_rows<D, T>(p, tile, h / group);
    const std::int64_t r0 = tr.row0, i0 = tr.i0, rows = tr.rows, kv_stride = tr.kv_stride;
    const T* k = static_cast<const T*>(p.k) + tr.kv_offset;  // key 0 of kv head h / group
    const T* v = static_cast<const T*>(p.v) + tr.kv_offset;
    __syncthreads();  // the previous task's warps are done with the shared tiles
    load_rows<D, kMmaQueryTile>(q_sh, p.q + r0 * q_stride + h * D, q_stride, static_cast<int>(rows));
    // This warp's rows of the sequence are [w0, w1] (none when w1 < w0).
    const std::int64_t w0 = i0 + warp * kRowsPerWarp, w1 = min(w0 + kRowsPerWarp, i0 + rows) - 1;
    RowState<D> st;
    start_rows(st);
    const std::int64_t key_end = i0 + rows;  // causal: the tile's last row sees keys up to key_end - 1
    for (std::int64_t j0 = first_visible(i0, p.window); j0 < key_end; j0 += Bc) {
      const int cnt = static_cast<int>(min(key_end - j0, static_cast<std::int64_t>(Bc)));
      __syncthreads();  // every warp is done with the previous K/V tile (and the queries are stored)
      load_rows<D, Bc>(k_sh, k + j0 * kv_stride, kv_stride, cnt);
      load_rows<D, Bc>(v_sh, v + j0 * kv_stride, kv_stride, cnt);
      if (j0 + Bc < key_end) {
        const int next = static_cast<int>(min(key_end - j0 - Bc, static_cast<std::int64_t>(Bc)));
        prefetch_rows<D>(k + (j0 + Bc) * kv_stride, kv_stride, next);
        prefetch_rows<D>(v + (j0 + Bc) * kv_stride, kv_stride, next);
      }
      __syncthreads();
      // Nothing for this warp when its rows see none of the tile's keys.
      if (w1 < w0 || j0 > w1 || j0 + cnt - 1 < first_visible(w0, p.window)) continue;
      // Every (row, key) visible when the tile's last key is at most the first row and its first
      // key in the last row's window (padding rows, whose queries are 0, then stay finite).
      const bool mask = j0 + Bc - 1 > w0 || j0 < first_visible(w1, p.window);
      float s[Bc / 8][4];
      tile_scores<D, Bc>(s, q_sh, k_sh, warp, lane);
      scale_and_mask<Bc>(s, p, mask, static_cast<int>(j0), static_cast<int>(w0), static_cast<int>(w1), lane);
      online_softmax<D, Bc>(s, st);
      accumulate_pv<D, Bc>(s, v_sh, st, lane);
    }
    if (w1 >= w0) store_rows(st, p.out + (r0 + warp * kRowsPerWarp) * q_stride + h * D, q_stride, w1 - w0 + 1, lane);
  }
}

// f(std::integral_constant<int, D>) for the head dims the kernel has.
template <class F>
auto with_head_dim(std::int64_t head_dim, F f) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 80: return f(std::integral_constant<int, 80>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: break;
  }
  throw std::invalid_argument("attention_prefill: no tensor-core kernel for head_dim " + std::to_string(head_dim));
}

// f(type tag) for the cache dtypes the kernel reads in place.
template <class F>
auto with_cache_type(DType cache_dtype, F f) {
  if (cache_dtype == DType::F16) return f(__half{});
  if (cache_dtype == DType::BF16) return f(__nv_bfloat16{});
  throw std::invalid_argument("attention_decode: no tensor-core kernel for a " + std::string(dtype_name(cache_dtype)) +
                              " cache");
}

// The score constants of Params from the shape: log2 units, with or without a soft-cap.
Params shape_params(const AttentionShape& s) {
  Params p;
  p.H = s.n_heads;
  p.Hkv = s.n_kv_heads;
  p.window = s.window;
  p.score_scale = s.softcap == 0.0f ? s.scale * kLog2e : s.scale / s.softcap;
  p.cap_log2 = s.softcap * kLog2e;
  return p;
}

}  // namespace

bool mma_prefill_has(std::int64_t head_dim) { return mma_head_dim(head_dim); }

const void* mma_prefill_kernel(std::int64_t head_dim) {
  return with_head_dim(head_dim, [](auto d) {
    return reinterpret_cast<const void*>(prefill_mma_kernel<decltype(d)::value, float>);
  });
}

const void* mma_cache_runs_kernel(std::int64_t head_dim, DType cache_dtype) {
  return with_head_dim(head_dim, [&](auto d) {
    return with_cache_type(cache_dtype, [](auto t) {
      return reinterpret_cast<const void*>(prefill_mma_kernel<decltype(d)::value, decltype(t)>);
    });
  });
}

std::size_t mma_prefill_shared_bytes(std::int64_t head_dim) {
  return with_head_dim(head_dim, [](auto d) { return shared_bytes<decltype(d)::value>(); });
}

void launch_mma_prefill(const MmaPrefillLaunch& l, cudaStream_t stream) {
  const AttentionShape& s = l.shape;
  Params p = shape_params(s);
  p.q = l.q;
  p.k = l.k;
  p.v = l.v;
  p.out = l.out;
  p.tiles = l.tiles;
  p.offsets = l.offsets;
  p.n_tiles = l.n_tiles;
  with_head_dim(s.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    prefill_mma_kernel<D, float><<<blocks_for(l.n_tiles * s.n_heads, 1), kMmaThreads, shared_bytes<D>(), stream>>>(p);
    FLEXH2O_CUDA_CHECK_LAUNCH();
    return 0;
  });
}

void launch_mma_cache_runs(const MmaCacheRunsLaunch& l, cudaStream_t stream) {
  const AttentionShape& s = l.shape;
  Params p = shape_params(s);
  p.q = l.q;
  p.k = l.k_cache;
  p.v = l.v_cache;
  p.out = l.out;
  p.tiles = l.tiles;
  p.n_tiles = l.n_tiles;
  p.capacity = l.capacity;
  with_head_dim(s.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return with_cache_type(l.cache_dtype, [&](auto t) {
      using T = decltype(t);
      prefill_mma_kernel<D, T><<<blocks_for(l.n_tiles * s.n_heads, 1), kMmaThreads, shared_bytes<D>(), stream>>>(p);
      FLEXH2O_CUDA_CHECK_LAUNCH();
      return 0;
    });
  });
}

}  // namespace flexh2o::kernels::cuda
