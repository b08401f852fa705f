// Attention on the GPU: fp32 throughout, no atomics, so every output is deterministic.
//
// Scores: every s = scale * (q . k) (soft-capped, Gemma-2) is computed by score(), one thread
// running a sequential fmaf over head_dim on copies in shared memory. The eviction scores need each probability
// p = exp(s - m) / l once the softmax's (m, l) are final, and use the very s the softmax did:
// at decode the split pass keeps its scores; at prefill, where T^2 scores per head are too
// many to keep, the column-sum pass calls score() on the same values, which gives the same
// bits (the arithmetic is pinned by the intrinsics, nothing is left for the compiler to fuse).
//
// Prefill (tiled): a block per (tile of kQueryTile query rows of one sequence, query head)
// keeps its queries in shared memory and streams the causal keys and values through it
// kKeyTile at a time (those within the sliding window, if any), with an online softmax per
// row; (m, l) per row go to `stats` when the column sums are wanted. Column sums: a block per
// (tile of keys, kv head) sums w_i * p(i, j) over the group's heads and the queries i >= j, in
// a fixed order. Under bf16 compute without column sums, prefill runs on tensor cores instead
// (attention_prefill_mma.cu).
//
// Decode (flash-decoding, plan_decode; docs/backends.md): a block per (sequence, kv head, chunk
// of the group's query heads, split of the keys) reads each cached key and value once, in
// place with 16-byte loads, for all the chunk's heads, in registers (its dot products are
// summed across lanes, not by score()); with several splits it leaves an unnormalised partial
// (acc, m, l) per head and split and a combine block per (sequence, head) merges them; the
// probs kernel sums the group's probabilities per slot from the kept scores and the final (m, l).
//
// Decode with shared prefixes (cascade attention, decode_cascade.h): a block per (prefix, kv
// head, chunk of the prefix, batch of 8 member query heads) reads the chunk from the prefix's
// row with the decode kernel's loop, the batch's queries in registers, and leaves a partial
// (acc, m, l) per member head; the decode kernel reads each query's own slots after its prefix
// into partials, and the combine merges both.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "kernels/cuda/attention_prefill_mma.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/decode_cascade.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/quantize.h"

namespace flexh2o::kernels::cuda {

namespace {

constexpr int kAttnThreads = 128;  // 4 warps
constexpr std::int64_t kQueryTile = 16;  // prefill: query rows per block
constexpr std::int64_t kKeyTile = 32;    // keys per shared-memory tile (a warp's width)
static_assert(kKeyTile == 32, "the softmax update gives each key of a tile a lane");
constexpr std::size_t kMinScratch = 256;  // CudaBackend::alloc's smallest allocation

// scale * (q . k) over d in [0, D), in this order, each step one rounding; then, with a
// soft-cap (cap > 0), cap * tanh(s / cap) as attention_cpu.cc.
__device__ __forceinline__ float score(const float* q, const float* k, std::int64_t D, float scale, float cap) {
  float dot = 0.0f;
  for (std::int64_t d = 0; d < D; ++d) dot = __fmaf_rn(q[d], k[d], dot);
  const float s = __fmul_rn(scale, dot);
  return cap == 0.0f ? s : __fmul_rn(cap, tanhf(__fdiv_rn(s, cap)));
}

// The first key a query at position p sees under a sliding window (0 without one).
__host__ __device__ __forceinline__ std::int64_t first_visible(std::int64_t p, std::int64_t window) {
  return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

__device__ __forceinline__ float warp_max_all(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;  // in every lane
}
__device__ __forceinline__ float warp_sum_all(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;  // in every lane, the same bits
}

// The online-softmax step of `rows` rows of a tile: scores s_sh[r * kKeyTile + j] (-inf for
// keys a row does not see) become weights exp(s - m_new), and m, l and the factor alpha that
// rescales the row's accumulator are updated. A warp per row.
__device__ __forceinline__ void softmax_tile(float* s_sh, float* m_sh, float* l_sh, float* alpha_sh, std::int64_t rows) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  for (std::int64_t r = warp; r < rows; r += warps) {
    const float s = s_sh[r * kKeyTile + lane];
    const float m_old = m_sh[r];
    const float m_new = fmaxf(m_old, warp_max_all(s));
    // A row that has seen no key yet (m_new = -inf) keeps weight 0 and its accumulator.
    const bool none = m_new == -INFINITY;
    const float p = none || s == -INFINITY ? 0.0f : expf(s - m_new);
    const float alpha = none ? 1.0f : expf(m_old - m_new);  // 0 on a row's first keys
    const float sum = warp_sum_all(p);
    s_sh[r * kKeyTile + lane] = p;
    if (lane == 0) {
      l_sh[r] = l_sh[r] * alpha + sum;
      m_sh[r] = m_new;
      alpha_sh[r] = alpha;
    }
  }
}

// acc[r][d] = acc[r][d] * alpha[r] + sum over the tile's cnt keys of p[r][j] * v[j][d].
__device__ __forceinline__ void accumulate_tile(float* acc_sh, const float* p_sh, const float* v_sh,
                                                const float* alpha_sh, std::int64_t rows, std::int64_t cnt,
                                                std::int64_t D, std::int64_t pitch) {
  for (std::int64_t e = threadIdx.x; e < rows * D; e += blockDim.x) {
    const std::int64_t r = e / D, d = e % D;
    float a = acc_sh[e] * alpha_sh[r];
    for (std::int64_t j = 0; j < cnt; ++j) a += p_sh[r * kKeyTile + j] * v_sh[j * pitch + d];
    acc_sh[e] = a;
  }
}

// ------------------------------------------------------------------------------- prefill

std::size_t prefill_shared_floats(std::int64_t D) {
  return static_cast<std::size_t>((kQueryTile + kKeyTile) * (D + 1) + kQueryTile * D + kQueryTile * kKeyTile +
                                  3 * kQueryTile);
}

// Block per (query tile, query head h). tiles[2 * t] = the tile's first row, tiles[2 * t + 1]
// its sequence. stats[2 * (row * H + h) + {0, 1}] = the row's final (m, l) when not null.
__global__ void prefill_kernel(const float* q, const float* k, const float* v, float* out, float* stats,
                               const std::int64_t* tiles, std::int64_t n_tiles, const std::int64_t* offsets,
                               std::int64_t H, std::int64_t Hkv, std::int64_t D, float scale, float cap,
                               std::int64_t window) {
  extern __shared__ float sh[];
  const std::int64_t P = D + 1;  // padded rows: the lanes of a warp read different rows conflict-free
  float* q_sh = sh;                            // [kQueryTile][P]
  float* kv_sh = q_sh + kQueryTile * P;        // [kKeyTile][P]: keys, then values
  float* acc_sh = kv_sh + kKeyTile * P;        // [kQueryTile][D]
  float* p_sh = acc_sh + kQueryTile * D;       // [kQueryTile][kKeyTile]
  float* m_sh = p_sh + kQueryTile * kKeyTile;  // [kQueryTile]
  float* l_sh = m_sh + kQueryTile;
  float* alpha_sh = l_sh + kQueryTile;
  const std::int64_t group = H / Hkv, q_stride = H * D, kv_stride = Hkv * D;
  for (std::int64_t task = blockIdx.x; task < n_tiles * H; task += gridDim.x) {
    const std::int64_t tile = task / H, h = task % H, g = h / group;
    const std::int64_t r0 = tiles[2 * tile], b = tiles[2 * tile + 1];
    const std::int64_t t0 = offsets[b], n = offsets[b + 1] - t0, i0 = r0 - t0;
    const std::int64_t rows = n - i0 < kQueryTile ? n - i0 : kQueryTile;
    __syncthreads();  // the previous task is done with the shared arrays
    for (std::int64_t e = threadIdx.x; e < kQueryTile * D; e += blockDim.x) {
      const std::int64_t r = e / D, d = e % D;
      q_sh[r * P + d] = r < rows ? q[(r0 + r) * q_stride + h * D + d] : 0.0f;
      acc_sh[e] = 0.0f;
    }
    for (std::int64_t r = threadIdx.x; r < kQueryTile; r += blockDim.x) {
      m_sh[r] = -INFINITY;
      l_sh[r] = 0.0f;
    }
    // Causal: the tile's last query sees keys up to i0 + rows - 1; its first none before
    // first_visible(i0) (tiles start there, aligned).
    const std::int64_t keys = i0 + rows;
    for (std::int64_t j0 = first_visible(i0, window) / kKeyTile * kKeyTile; j0 < keys; j0 += kKeyTile) {
      const std::int64_t cnt = keys - j0 < kKeyTile ? keys - j0 : kKeyTile;
      __syncthreads();  // the previous tile's readers are done with kv_sh and p_sh
      for (std::int64_t e = threadIdx.x; e < cnt * D; e += blockDim.x) {
        const std::int64_t j = e / D, d = e % D;
        kv_sh[j * P + d] = k[(t0 + j0 + j) * kv_stride + g * D + d];
      }
      __syncthreads();
      for (std::int64_t e = threadIdx.x; e < kQueryTile * kKeyTile; e += blockDim.x) {
        const std::int64_t r = e / kKeyTile, j = e % kKeyTile;
        const bool seen = r < rows && j < cnt && j0 + j <= i0 + r && j0 + j >= first_visible(i0 + r, window);
        p_sh[e] = seen ? score(q_sh + r * P, kv_sh + j * P, D, scale, cap) : -INFINITY;
      }
      __syncthreads();
      softmax_tile(p_sh, m_sh, l_sh, alpha_sh, rows);
      __syncthreads();  // the keys are read: the values take their place
      for (std::int64_t e = threadIdx.x; e < cnt * D; e += blockDim.x) {
        const std::int64_t j = e / D, d = e % D;
        kv_sh[j * P + d] = v[(t0 + j0 + j) * kv_stride + g * D + d];
      }
      __syncthreads();
      accumulate_tile(acc_sh, p_sh, kv_sh, alpha_sh, rows, cnt, D, P);
    }
    __syncthreads();
    for (std::int64_t e = threadIdx.x; e < rows * D; e += blockDim.x) {
      const std::int64_t r = e / D, d = e % D;
      out[(r0 + r) * q_stride + h * D + d] = acc_sh[e] / l_sh[r];
    }
    if (stats != nullptr)
      for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        stats[2 * ((r0 + r) * H + h)] = m_sh[r];
        stats[2 * ((r0 + r) * H + h) + 1] = l_sh[r];
      }
  }
}

std::size_t col_sums_shared_floats(std::int64_t D) {
  return static_cast<std::size_t>((kKeyTile + kQueryTile) * (D + 1) + kQueryTile * kKeyTile + 3 * kQueryTile +
                                  kKeyTile);
}

// Block per (key tile, kv head g); tiles[2 * t] = the tile's first row, tiles[2 * t + 1] its
// sequence. col_sums[t0 * Hkv + g * n + j] = sum over the group's heads h (in order) and the
// queries i >= j (in order) of w_i * exp(s_h(i, j) - m_h(i)) / l_h(i).
__global__ void col_sums_kernel(const float* q, const float* k, const float* stats, const std::int64_t* tiles,
                                std::int64_t n_tiles, const std::int64_t* offsets, const float* query_weights,
                                float* col_sums, std::int64_t H, std::int64_t Hkv, std::int64_t D, float scale,
                                float cap, std::int64_t window) {
  extern __shared__ float sh[];
  const std::int64_t P = D + 1;
  float* k_sh = sh;                            // [kKeyTile][P]
  float* q_sh = k_sh + kKeyTile * P;           // [kQueryTile][P]
  float* p_sh = q_sh + kQueryTile * P;         // [kQueryTile][kKeyTile]
  float* m_sh = p_sh + kQueryTile * kKeyTile;  // [kQueryTile]
  float* l_sh = m_sh + kQueryTile;
  float* w_sh = l_sh + kQueryTile;
  float* col_sh = w_sh + kQueryTile;  // [kKeyTile]
  const std::int64_t group = H / Hkv, q_stride = H * D, kv_stride = Hkv * D;
  for (std::int64_t task = blockIdx.x; task < n_tiles * Hkv; task += gridDim.x) {
    const std::int64_t tile = task / Hkv, g = task % Hkv;
    const std::int64_t r0 = tiles[2 * tile], b = tiles[2 * tile + 1];
    const std::int64_t t0 = offsets[b], n = offsets[b + 1] - t0, j0 = r0 - t0;
    const std::int64_t cnt = n - j0 < kKeyTile ? n - j0 : kKeyTile;
    __syncthreads();  // the previous task is done with the shared arrays
    for (std::int64_t e = threadIdx.x; e < cnt * D; e += blockDim.x) {
      const std::int64_t j = e / D, d = e % D;
      k_sh[j * P + d] = k[(r0 + j) * kv_stride + g * D + d];
    }
    for (std::int64_t j = threadIdx.x; j < kKeyTile; j += blockDim.x) col_sh[j] = 0.0f;
    // Queries i >= j0 that see a key of the tile: under a window, up to its last key's window.
    const std::int64_t i_end = window > 0 && j0 + cnt - 1 + window < n ? j0 + cnt - 1 + window : n;
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (std::int64_t i0 = j0; i0 < i_end; i0 += kQueryTile) {
        const std::int64_t rows = n - i0 < kQueryTile ? n - i0 : kQueryTile;
        __syncthreads();  // the previous query tile's readers are done
        for (std::int64_t e = threadIdx.x; e < rows * D; e += blockDim.x) {
          const std::int64_t r = e / D, d = e % D;
          q_sh[r * P + d] = q[(t0 + i0 + r) * q_stride + h * D + d];
        }
        for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
          const std::int64_t row = t0 + i0 + r;
          m_sh[r] = stats[2 * (row * H + h)];
          l_sh[r] = stats[2 * (row * H + h) + 1];
          w_sh[r] = query_weights != nullptr ? query_weights[row] : 1.0f;
        }
        __syncthreads();
        for (std::int64_t e = threadIdx.x; e < kQueryTile * kKeyTile; e += blockDim.x) {
          const std::int64_t r = e / kKeyTile, j = e % kKeyTile;
          const bool seen = r < rows && j < cnt && j0 + j <= i0 + r && j0 + j >= first_visible(i0 + r, window);
          p_sh[e] = seen ? w_sh[r] * (expf(score(q_sh + r * P, k_sh + j * P, D, scale, cap) - m_sh[r]) / l_sh[r]) : 0.0f;
        }
        __syncthreads();
        for (std::int64_t j = threadIdx.x; j < cnt; j += blockDim.x) {
          float acc = col_sh[j];
          for (std::int64_t r = 0; r < rows; ++r) acc += p_sh[r * kKeyTile + j];
          col_sh[j] = acc;
        }
      }
    }
    __syncthreads();
    for (std::int64_t j = threadIdx.x; j < cnt; j += blockDim.x) col_sums[t0 * Hkv + g * n + j0 + j] = col_sh[j];
  }
}

// -------------------------------------------------------------------------------- decode

// Decode reads every cached byte once per step, so it is bound by memory: the kernel keeps the
// loads wide and many in flight, and does the arithmetic in registers.
//
// Layout of a block (kDecodeThreads threads, task = (sequence, kv head, head chunk, split)):
// a key takes `lanes` consecutive lanes (a power of two, lanes * 8 * C >= head_dim), lane
// `sub` of a key holding elements [8 * (c * lanes + sub), + 8) for c < C; the block's
// kDecodeThreads / lanes key groups take consecutive slots, U keys each per step, so a warp's
// loads of one step are contiguous. Every key group keeps its own online softmax (m, l, acc)
// per query head of the chunk (HB of them in registers, the chunk's heads and up to HB - nh
// idle ones with a zero query); dot products are summed across the key's lanes by xor
// shuffles, which leave the same bits in every lane. At the end the key groups of a warp merge
// by shuffles, the warps through shared memory, in a fixed order: no atomics, the same bits
// on every run.
constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;

// Where the parts of a cache slot lie: head_dim values, then (quantized caches) a 4-byte
// (f16 scale, f16 min) per group of kQuantGroupSize values after code_bytes of codes.
struct SlotFormat {
  std::int64_t head_dim = 0, code_bytes = 0;
  DType dtype = DType::F32;
};

// Eight consecutive values [e0, e0 + 8) of a slot, loaded with the fewest accesses the dtype
// allows and widened to fp32 where they are used (registers hold the narrow form meanwhile).
// A default-constructed slice widens to zeros: lanes past head_dim and keys past the split.
// The vector forms need head_dim % 8 == 0 and slots aligned to 16 bytes (f32/f16/bf16) or 4
// (q8/q4, whose rows are then a multiple of 4 bytes); AnySlice reads any slot value by value.
struct F32Slice {
  float4 lo{}, hi{};
  __device__ __forceinline__ void load(const std::uint8_t* slot, const SlotFormat&, std::int64_t e0) {
    const auto* p = reinterpret_cast<const float4*>(slot + 4 * e0);
    lo = __ldg(p);
    hi = __ldg(p + 1);
  }
  __device__ __forceinline__ void widen(float (&x)[8], const SlotFormat&) const {
    x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
  }
};

template <bool kBf16>
struct Half16Slice {  // f16 or bf16: one 16-byte load
  uint4 bits{};
  __device__ __forceinline__ void load(const std::uint8_t* slot, const SlotFormat&, std::int64_t e0) {
    bits = __ldg(reinterpret_cast<const uint4*>(slot + 2 * e0));
  }
  __device__ __forceinline__ void widen(float (&x)[8], const SlotFormat&) const {
    const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const auto lo = static_cast<std::uint16_t>(words[w] & 0xffffu), hi = static_cast<std::uint16_t>(words[w] >> 16);
      x[2 * w] = kBf16 ? bf16_bits_to_f32(lo) : f16_bits_to_f32(lo);
      x[2 * w + 1] = kBf16 ? bf16_bits_to_f32(hi) : f16_bits_to_f32(hi);
    }
  }
};
using F16Slice = Half16Slice<false>;
using BF16Slice = Half16Slice<true>;

// q * scale + min with the (scale, min) of the slice's group, rounded as dequant_at does.
__device__ __forceinline__ float dequant(unsigned code, unsigned params) {
  const float s = f16_bits_to_f32(static_cast<std::uint16_t>(params & 0xffffu));
  const float m = f16_bits_to_f32(static_cast<std::uint16_t>(params >> 16));
  return __fadd_rn(__fmul_rn(static_cast<float>(code), s), m);
}
__device__ __forceinline__ unsigned group_params(const std::uint8_t* slot, const SlotFormat& f, std::int64_t e0) {
  return __ldg(reinterpret_cast<const unsigned*>(slot + f.code_bytes + 4 * (e0 / kQuantGroupSize)));
}

struct Q8Slice {  // 8 code bytes and the group's parameters: three 4-byte loads
  unsigned lo = 0, hi = 0, params = 0;
  __device__ __forceinline__ void load(const std::uint8_t* slot, const SlotFormat& f, std::int64_t e0) {
    const auto* codes = reinterpret_cast<const unsigned*>(slot + e0);
    lo = __ldg(codes);
    hi = __ldg(codes + 1);
    params = group_params(slot, f, e0);
  }
  __device__ __forceinline__ void widen(float (&x)[8], const SlotFormat&) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = dequant(((i < 4 ? lo : hi) >> (8 * (i % 4))) & 0xffu, params);
  }
};

struct Q4Slice {  // 8 nibbles and the group's parameters: two 4-byte loads
  unsigned codes = 0, params = 0;
  __device__ __forceinline__ void load(const std::uint8_t* slot, const SlotFormat& f, std::int64_t e0) {
    codes = __ldg(reinterpret_cast<const unsigned*>(slot + e0 / 2));
    params = group_params(slot, f, e0);
  }
  __device__ __forceinline__ void widen(float (&x)[8], const SlotFormat&) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = dequant((codes >> (4 * i)) & 0xfu, params);
  }
};

struct AnySlice {  // any dtype and head_dim: value by value, read where used (few registers)
  const std::uint8_t* slot = nullptr;
  std::int64_t e0 = 0;
  __device__ __forceinline__ void load(const std::uint8_t* s, const SlotFormat&, std::int64_t first) {
    slot = s;
    e0 = first;
  }
  __device__ __forceinline__ void widen(float (&x)[8], const SlotFormat& f) const {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      x[i] = slot != nullptr && e0 + i < f.head_dim ? load_elem(slot, f.dtype, f.head_dim, e0 + i) : 0.0f;
  }
};

struct DecodeParams {
  const float* q = nullptr;  // [B, H, D]
  const std::uint8_t* k_cache = nullptr;
  const std::uint8_t* v_cache = nullptr;
  const std::int64_t* lens = nullptr;
  const std::int64_t* cache_rows = nullptr;  // [B] cache row of each query; null: row b
  // [tasks' B]: the query (of q, lens, cache_rows, slot_bias, out) of the kernel's sequence b,
  // when it runs a subset of a call's queries (without probs); null: query b.
  const std::int64_t* query_rows = nullptr;
  const float* slot_bias = nullptr;  // [B, Hkv, capacity] or null
  // [B]: the first slot sequence b reads (its shared prefix's len, the prefix read apart); null:
  // the first slot of its window.
  const std::int64_t* starts = nullptr;
  std::int64_t H = 0, Hkv = 0, capacity = 0, slot_bytes = 0;
  SlotFormat format;
  float scale = 1.0f, softcap = 0.0f;
  std::int64_t window = 0;
  DecodePlan plan;
  std::int64_t tasks = 0;  // B * Hkv * head_chunks * splits
  int lanes = 1;           // per key
  // Without part_acc (one split): out [B, H, D] and, when not null, the (m, l) of every
  // (sequence, head) in ml. With it: part_acc [B, H, splits, D] (unnormalised) and part_ml
  // [B, H, splits, 2], merged by the combine kernel.
  float* out = nullptr;
  float* ml = nullptr;
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  float* scores = nullptr;  // [B, H, capacity]: the softmax's scores, when not null
};

// One key group's online softmax over the keys it has seen, per query head of the chunk:
// E = 8 * C elements of q and of the unnormalised output in each lane.
template <int HB, int E>
struct HeadStates {
  float q[HB][E];
  float acc[HB][E];
  float m[HB], l[HB];
};

// 0 for a state that has seen no key (m = -inf), else exp(m - to).
__device__ __forceinline__ float rescale(float m, float to) { return m == -INFINITY ? 0.0f : expf(m - to); }

// The element a lane holds at slice c, value i.
__device__ __forceinline__ std::int64_t lane_elem(int c, int lanes, int sub, int i) { return 8 * (c * lanes + sub) + i; }

template <int HB, int C>
__device__ __forceinline__ void start_heads(HeadStates<HB, 8 * C>& st, const float* q, std::int64_t nh,
                                            std::int64_t D, int lanes, int sub) {
#pragma unroll
  for (int h = 0; h < HB; ++h) {
    st.m[h] = -INFINITY;
    st.l[h] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const std::int64_t d = lane_elem(c, lanes, sub, i);
        st.q[h][8 * c + i] = h < nh && d < D ? q[h * D + d] : 0.0f;
        st.acc[h][8 * c + i] = 0.0f;
      }
  }
}

// Scores of U keys, the split's keys r[u] (-inf for r[u] >= count, past the split, and for
// r[u] < from[h], before head h's window), for every head: q . k summed over the key's lanes,
// scaled, soft-capped and biased as the CPU does; kept in `scores` when asked for. bias and
// scores start at the split's first key.
template <class Slice, int HB, int C, int U>
__device__ __forceinline__ void key_scores(const HeadStates<HB, 8 * C>& st, const Slice (&k)[U][C], const int (&r)[U],
                                           int count, const int (&from)[HB], const DecodeParams& p, const float* bias,
                                           float* scores, std::int64_t nh, int lanes, int sub, float (&s)[U][HB]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float dot[HB] = {};
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float x[8];
      k[u][c].widen(x, p.format);
#pragma unroll
      for (int h = 0; h < HB; ++h)
#pragma unroll
        for (int i = 0; i < 8; ++i) dot[h] = fmaf(st.q[h][8 * c + i], x[i], dot[h]);
    }
    for (int off = lanes >> 1; off > 0; off >>= 1)
#pragma unroll
      for (int h = 0; h < HB; ++h) dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], off);
    const bool valid = r[u] < count;
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      float x = p.scale * dot[h];
      if (p.softcap != 0.0f) x = p.softcap * tanhf(x / p.softcap);
      if (bias != nullptr && valid) x += bias[r[u]];
      s[u][h] = valid && r[u] >= from[h] ? x : -INFINITY;
      if (scores != nullptr && valid && sub == 0 && h < nh) scores[h * p.capacity + r[u]] = x;
    }
  }
}

// The online-softmax step over U keys: m grows to the largest score seen, the accumulator
// and l are rescaled to it, and each key's value is added with weight exp(s - m).
template <class Slice, int HB, int C, int U>
__device__ __forceinline__ void key_values(HeadStates<HB, 8 * C>& st, const Slice (&v)[U][C], const SlotFormat& f,
                                           float (&s)[U][HB]) {
#pragma unroll
  for (int h = 0; h < HB; ++h) {
    float m_new = st.m[h];
#pragma unroll
    for (int u = 0; u < U; ++u) m_new = fmaxf(m_new, s[u][h]);
    // A head that has seen no key yet (m_new = -inf) keeps weight 0 and its accumulator.
    const bool none = m_new == -INFINITY;
    const float alpha = none ? 1.0f : expf(st.m[h] - m_new);  // 0 on a head's first keys
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s[u][h] = none ? 0.0f : expf(s[u][h] - m_new);  // 0 for keys past the split
      sum += s[u][h];
    }
    st.l[h] = st.l[h] * alpha + sum;
    st.m[h] = m_new;
#pragma unroll
    for (int e = 0; e < 8 * C; ++e) st.acc[h][e] *= alpha;
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float x[8];
      v[u][c].widen(x, f);
#pragma unroll
      for (int h = 0; h < HB; ++h)
#pragma unroll
        for (int i = 0; i < 8; ++i) st.acc[h][8 * c + i] = fmaf(s[u][h], x[i], st.acc[h][8 * c + i]);
    }
}

// Merges the key groups of a warp (lanes `lanes` apart hold the same elements) by xor
// shuffles: every lane ends with the warp's state of its elements.
template <int HB, int E>
__device__ __forceinline__ void merge_warp(HeadStates<HB, E>& st, int lanes) {
  for (int off = lanes; off < 32; off <<= 1)
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      const float m_o = __shfl_xor_sync(0xffffffffu, st.m[h], off);
      const float l_o = __shfl_xor_sync(0xffffffffu, st.l[h], off);
      const float m = fmaxf(st.m[h], m_o), f = rescale(st.m[h], m), f_o = rescale(m_o, m);
      st.l[h] = st.l[h] * f + l_o * f_o;
      st.m[h] = m;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float a_o = __shfl_xor_sync(0xffffffffu, st.acc[h][e], off);
        st.acc[h][e] = st.acc[h][e] * f + a_o * f_o;
      }
    }
}

// Merges the warps' states (in warp order) through shared memory `sh` (kDecodeWarps * HB *
// (D + 2) floats) and stores the chunk's heads: the output itself without partials (its first
// head at out_bh0), else the split's partial (at bh0). Synchronises the block; the caller may
// reuse `sh` afterwards.
template <int HB, int C>
__device__ __forceinline__ void store_heads(const HeadStates<HB, 8 * C>& st, float* sh, const DecodeParams& p,
                                            std::int64_t bh0, std::int64_t out_bh0, std::int64_t nh, std::int64_t sp,
                                            int lanes, int sub) {
  const std::int64_t D = p.format.head_dim;
  float* m_sh = sh;                          // [warp][HB]
  float* l_sh = m_sh + kDecodeWarps * HB;    // [warp][HB]
  float* acc_sh = l_sh + kDecodeWarps * HB;  // [warp][HB][D]
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  if (lane < lanes) {  // the first key group of the warp
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      m_sh[warp * HB + h] = st.m[h];
      l_sh[warp * HB + h] = st.l[h];
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const std::int64_t d = lane_elem(c, lanes, sub, i);
          if (d < D) acc_sh[(warp * HB + h) * D + d] = st.acc[h][8 * c + i];
        }
    }
  }
  __syncthreads();
  const std::int64_t splits = p.plan.splits;
  for (std::int64_t e = threadIdx.x; e < nh * D; e += kDecodeThreads) {
    const std::int64_t h = e / D, d = e % D, bh = bh0 + h;
    float m = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w) m = fmaxf(m, m_sh[w * HB + h]);
    float l = 0.0f, o = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float f = rescale(m_sh[w * HB + h], m);
      l += l_sh[w * HB + h] * f;
      o += acc_sh[(w * HB + h) * D + d] * f;
    }
    // An empty split (no visible key, or no own slot after a shared prefix) leaves (m, l) =
    // (-inf, 0) and acc = 0: it weighs nothing in the combine; without partials (one split, no
    // shared prefix) every sequence has a key, so l > 0.
    float* ml = nullptr;
    if (p.part_acc == nullptr) {
      p.out[(out_bh0 + h) * D + d] = o / l;
      if (p.ml != nullptr) ml = p.ml + 2 * bh;
    } else {
      p.part_acc[(bh * splits + sp) * D + d] = o;
      ml = p.part_ml + 2 * (bh * splits + sp);
    }
    if (ml != nullptr && d == 0) {
      ml[0] = m;
      ml[1] = l;
    }
  }
  __syncthreads();  // the next task may write sh
}

// Keys in flight per key group and step: fewer where the registers are full of heads (and one
// for AnySlice, which reads where it widens).
template <class Slice, int HB, int C>
constexpr int kKeysInFlight = C > 1 || std::is_same_v<Slice, AnySlice> ? 1 : (HB >= 8 ? 2 : 4);

// The key loop of a block: its key group's keys r = key_group, + key_groups, ... below count (of
// the split or chunk whose first key's slots k_slot and v_slot point at, plus key_group), U at a
// time, into st. The same steps in every lane (the shuffles need the whole warp); keys past count
// are not read and score -inf, as keys r < from[h] do for head h.
template <class Slice, int HB, int C>
__device__ __forceinline__ void read_keys(HeadStates<HB, 8 * C>& st, const std::uint8_t* k_slot,
                                          const std::uint8_t* v_slot, int count, const int (&from)[HB],
                                          const DecodeParams& p,
                                          const float* bias, float* scores, std::int64_t nh, int lanes, int sub,
                                          int key_group, int key_groups) {
  constexpr int U = kKeysInFlight<Slice, HB, C>;
  const std::int64_t D = p.format.head_dim, stride = key_groups * p.slot_bytes;
#pragma unroll 1
  for (int r0 = 0; r0 < count; r0 += key_groups * U) {
    Slice ks[U][C], vs[U][C];
    int r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      r[u] = r0 + u * key_groups + key_group;
#pragma unroll
      for (int cc = 0; cc < C; ++cc) {
        const std::int64_t e0 = lane_elem(cc, lanes, sub, 0);
        if (r[u] < count && e0 < D) {
          ks[u][cc].load(k_slot + u * stride, p.format, e0);
          vs[u][cc].load(v_slot + u * stride, p.format, e0);
        }
      }
    }
    k_slot += U * stride;
    v_slot += U * stride;
    float s[U][HB];
    key_scores<Slice, HB, C, U>(st, ks, r, count, from, p, bias, scores, nh, lanes, sub, s);
    key_values<Slice, HB, C, U>(st, vs, p.format, s);
  }
}

// Block per task (sequence b, kv head g, head chunk c, split sp): keys [k0, k1) = the split's
// share of the visible ones [first_visible(lens[b] - 1), lens[b]) (slot s holds position s
// under a window; [starts[b], lens[b]) after a shared prefix), query heads [g * group + c * hb, + nh).
template <class Slice, int HB, int C>
__global__ void __launch_bounds__(kDecodeThreads, 1) decode_kernel(const DecodeParams p) {
  extern __shared__ float merge_sh[];
  const int lanes = p.lanes, sub = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int key_group = static_cast<int>(threadIdx.x) / lanes, key_groups = kDecodeThreads / lanes;
  const std::int64_t D = p.format.head_dim, group = p.H / p.Hkv, hb = p.plan.heads_per_block;
  const std::int64_t splits = p.plan.splits, chunks = p.plan.head_chunks, kps = p.plan.keys_per_split;
  for (std::int64_t task = blockIdx.x; task < p.tasks; task += gridDim.x) {
    const std::int64_t sp = task % splits, c = (task / splits) % chunks, bg = task / (splits * chunks);
    const std::int64_t b = bg / p.Hkv, g = bg % p.Hkv, qb = p.query_rows != nullptr ? p.query_rows[b] : b;
    const std::int64_t h0 = g * group + c * hb, nh = group - c * hb < hb ? group - c * hb : hb;
    const std::int64_t n = p.lens[qb], start = p.starts != nullptr ? p.starts[b] : first_visible(n - 1, p.window);
    const std::int64_t k0 = start + sp * kps, k1 = n < k0 + kps ? n : k0 + kps;
    const int count = static_cast<int>(k1 > k0 ? k1 - k0 : 0);
    const std::int64_t row = (p.cache_rows != nullptr ? p.cache_rows[qb] : qb) * p.Hkv + g;
    const std::int64_t first = (row * p.capacity + k0 + key_group) * p.slot_bytes;
    const float* bias = p.slot_bias != nullptr ? p.slot_bias + (qb * p.Hkv + g) * p.capacity + k0 : nullptr;
    float* scores = p.scores != nullptr ? p.scores + (b * p.H + h0) * p.capacity + k0 : nullptr;
    HeadStates<HB, 8 * C> st;
    start_heads<HB, C>(st, p.q + (qb * p.H + h0) * D, nh, D, lanes, sub);
    const int all[HB] = {};  // every head sees the split's keys
    read_keys<Slice, HB, C>(st, p.k_cache + first, p.v_cache + first, count, all, p, bias, scores, nh, lanes, sub,
                            key_group, key_groups);
    merge_warp(st, lanes);
    store_heads<HB, C>(st, merge_sh, p, b * p.H + h0, qb * p.H + h0, nh, sp, lanes, sub);
  }
}

// The prefix tasks of a call (decode_cascade.h): the task table, each member's query and the
// first position its window sees.
struct PrefixTables {
  const PrefixTask* tasks = nullptr;
  std::int64_t n_tasks = 0;
  const std::int64_t* member_queries = nullptr;
  const std::int64_t* member_first = nullptr;
};

// start_heads for a prefix task's member heads: the block's head i is member head
// heads_first + i of the prefix (query head mh % group of kv head kv_head of member mh / group).
template <int HB, int C>
__device__ __forceinline__ void start_member_heads(HeadStates<HB, 8 * C>& st, const DecodeParams& p,
                                                   const PrefixTables& t, const PrefixTask& task, int lanes, int sub) {
  const std::int64_t D = p.format.head_dim, group = p.H / p.Hkv;
#pragma unroll
  for (int h = 0; h < HB; ++h) {
    st.m[h] = -INFINITY;
    st.l[h] = 0.0f;
    const std::int64_t mh = task.heads_first + h;
    const float* q = h < task.heads
                         ? p.q + (t.member_queries[task.members_first + mh / group] * p.H + task.kv_head * group +
                                  mh % group) * D
                         : nullptr;
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const std::int64_t d = lane_elem(c, lanes, sub, i);
        st.q[h][8 * c + i] = q != nullptr && d < D ? q[d] : 0.0f;
        st.acc[h][8 * c + i] = 0.0f;
      }
  }
}

// Block per prefix task: its chunk of the prefix, read from the prefix's row in place by the
// decode kernel's loop for all the task's member heads at once (up to HB, in registers), leaves
// their partials at task.partials + i (p.part_acc and p.part_ml hold the prefix partials, with one
// "split").
template <class Slice, int HB, int C>
__global__ void __launch_bounds__(kDecodeThreads, 1) prefix_kernel(const DecodeParams p, const PrefixTables t) {
  extern __shared__ float merge_sh[];
  const int lanes = p.lanes, sub = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int key_group = static_cast<int>(threadIdx.x) / lanes, key_groups = kDecodeThreads / lanes;
  for (std::int64_t i = blockIdx.x; i < t.n_tasks; i += gridDim.x) {
    const PrefixTask task = t.tasks[i];
    const std::int64_t row = task.row * p.Hkv + task.kv_head;
    const std::int64_t first = (row * p.capacity + task.first + key_group) * p.slot_bytes;
    HeadStates<HB, 8 * C> st;
    start_member_heads<HB, C>(st, p, t, task, lanes, sub);
    int from[HB];  // each head's first key of the chunk within its member's window
    const std::int64_t group = p.H / p.Hkv;
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      const std::int64_t seen =
          h < task.heads ? t.member_first[task.members_first + (task.heads_first + h) / group] - task.first : 0;
      from[h] = static_cast<int>(seen > 0 ? seen : 0);
    }
    read_keys<Slice, HB, C>(st, p.k_cache + first, p.v_cache + first, static_cast<int>(task.end - task.first), from,
                            p, nullptr, nullptr, task.heads, lanes, sub, key_group, key_groups);
    merge_warp(st, lanes);
    store_heads<HB, C>(st, merge_sh, p, task.partials, task.partials, task.heads, 0, lanes, sub);
  }
}

// The prefix partials of a call's queries (decode_cascade.h, PrefixRef), for the combine; refs
// null: none.
struct PrefixPartials {
  const float* acc = nullptr;  // [partials, D]
  const float* ml = nullptr;   // [partials, 2]
  const PrefixRef* refs = nullptr;
  std::int64_t group = 1;
};

// Block per (sequence, query head) = task: out = sum over its partials (the splits in order, then
// its prefix's chunks in order) of acc_s * exp(m_s - m) / l, m the largest m_s and l = sum of
// l_s * exp(m_s - m); (m, l) to ml when not null. query_rows (DecodeParams) places sequence b's
// heads at query query_rows[b] of out.
__global__ void decode_combine_kernel(const float* part_acc, const float* part_ml, std::int64_t tasks,
                                      std::int64_t splits, std::int64_t D, std::int64_t H,
                                      const std::int64_t* query_rows, float* out, float* ml,
                                      const PrefixPartials prefix) {
  for (std::int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const std::int64_t out_task = query_rows != nullptr ? query_rows[task / H] * H + task % H : task;
    const float* pm = part_ml + 2 * task * splits;
    const PrefixRef ref = prefix.refs != nullptr ? prefix.refs[task / H] : PrefixRef{};
    const std::int64_t h = task % H, chunk0 = ref.first + (h / prefix.group) * ref.kv_stride + h % prefix.group;
    // A query sees at least one key, in its first split or its prefix's first chunk: m is finite.
    float m = -INFINITY;
    for (std::int64_t sp = 0; sp < splits; ++sp) m = fmaxf(m, pm[2 * sp]);
    for (std::int64_t c = 0; c < ref.chunks; ++c) m = fmaxf(m, prefix.ml[2 * (chunk0 + c * ref.chunk_stride)]);
    float l = 0.0f;
    for (std::int64_t sp = 0; sp < splits; ++sp) l += pm[2 * sp + 1] * rescale(pm[2 * sp], m);
    for (std::int64_t c = 0; c < ref.chunks; ++c) {
      const float* cm = prefix.ml + 2 * (chunk0 + c * ref.chunk_stride);
      l += cm[1] * rescale(cm[0], m);
    }
    for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float o = 0.0f;
      for (std::int64_t sp = 0; sp < splits; ++sp) o += part_acc[(task * splits + sp) * D + d] * rescale(pm[2 * sp], m);
      for (std::int64_t c = 0; c < ref.chunks; ++c) {
        const std::int64_t at = chunk0 + c * ref.chunk_stride;
        o += prefix.acc[at * D + d] * rescale(prefix.ml[2 * at], m);
      }
      out[out_task * D + d] = o / l;
    }
    if (ml != nullptr && threadIdx.x == 0) {
      ml[2 * task] = m;
      ml[2 * task + 1] = l;
    }
  }
}

// Thread per (sequence b, kv head g, slot j < lens[b]): probs = sum over the group's heads (in
// order) of exp(s - m) / l, from the split pass's scores and the combined (m, l); 0 for slots
// outside the sliding window.
__global__ void decode_probs_kernel(const float* scores, const float* ml, const std::int64_t* lens, std::int64_t B,
                                    std::int64_t H, std::int64_t Hkv, std::int64_t capacity, std::int64_t window,
                                    float* probs) {
  const std::int64_t group = H / Hkv, total = B * Hkv * capacity;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = e % capacity, bg = e / capacity, b = bg / Hkv, g = bg % Hkv;
    if (j >= lens[b]) continue;  // left untouched
    if (j < first_visible(lens[b] - 1, window)) {
      probs[e] = 0.0f;
      continue;
    }
    float p = 0.0f;
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h)
      p += expf(scores[(b * H + h) * capacity + j] - ml[2 * (b * H + h)]) / ml[2 * (b * H + h) + 1];
    probs[e] = p;
  }
}

template <class Slice, int HB, int C>
void launch_decode(const DecodeParams& p, cudaStream_t stream) {
  const std::size_t shared = static_cast<std::size_t>(kDecodeWarps * HB * (p.format.head_dim + 2)) * sizeof(float);
  decode_kernel<Slice, HB, C><<<blocks_for(p.tasks, 1), kDecodeThreads, shared, stream>>>(p);
}
template <class Slice, int HB, int C>
void launch_prefix(const DecodeParams& p, const PrefixTables& t, cudaStream_t stream) {
  const std::size_t shared = static_cast<std::size_t>(kDecodeWarps * HB * (p.format.head_dim + 2)) * sizeof(float);
  prefix_kernel<Slice, HB, C><<<blocks_for(t.n_tasks, 1), kDecodeThreads, shared, stream>>>(p, t);
}

// Registers for HB = 1, 2, 4 or 8 heads of eight values a lane, or one head of 32 values a
// lane above kDecodeWideHeadDim. The prefix kernel (t not null) takes 8 (one above
// kDecodeWideHeadDim, prefix_batch_heads).
template <class Slice>
void launch_decode_heads(const DecodeParams& p, const PrefixTables* t, cudaStream_t stream) {
  const std::int64_t hb = p.plan.heads_per_block;
  if (p.format.head_dim > kDecodeWideHeadDim)
    return t != nullptr ? launch_prefix<Slice, 1, 4>(p, *t, stream) : launch_decode<Slice, 1, 4>(p, stream);
  if (t != nullptr) return launch_prefix<Slice, 8, 1>(p, *t, stream);
  if (hb == 1) return launch_decode<Slice, 1, 1>(p, stream);
  if (hb == 2) return launch_decode<Slice, 2, 1>(p, stream);
  if (hb <= 4) return launch_decode<Slice, 4, 1>(p, stream);
  launch_decode<Slice, 8, 1>(p, stream);
}

bool aligned_to(const void* ptr, std::int64_t slot_bytes, std::int64_t bytes) {
  return reinterpret_cast<std::uintptr_t>(ptr) % static_cast<std::uintptr_t>(bytes) == 0 && slot_bytes % bytes == 0;
}

// The widest loads the cache's dtype and alignment allow (SlotFormat, F32Slice...).
void launch_decode(const DecodeParams& p, cudaStream_t stream, const PrefixTables* t = nullptr) {
  const std::int64_t align = is_quantized(p.format.dtype) ? 4 : 16;
  const bool vector = p.format.head_dim % 8 == 0 && aligned_to(p.k_cache, p.slot_bytes, align) &&
                      aligned_to(p.v_cache, p.slot_bytes, align);
  if (!vector) return launch_decode_heads<AnySlice>(p, t, stream);
  switch (p.format.dtype) {
    case DType::F32: return launch_decode_heads<F32Slice>(p, t, stream);
    case DType::F16: return launch_decode_heads<F16Slice>(p, t, stream);
    case DType::BF16: return launch_decode_heads<BF16Slice>(p, t, stream);
    case DType::Q8: return launch_decode_heads<Q8Slice>(p, t, stream);
    case DType::Q4: return launch_decode_heads<Q4Slice>(p, t, stream);
    case DType::Q4G32:
    case DType::Q8G32: break;  // groups of 32: value by value
  }
  launch_decode_heads<AnySlice>(p, t, stream);
}

// The member heads a prefix task takes: the prefix kernel's heads in registers.
std::int64_t prefix_batch_heads(std::int64_t head_dim) { return head_dim > kDecodeWideHeadDim ? 1 : 8; }

// Lanes a key takes: enough for head_dim at 8 values a lane (32 above kDecodeWideHeadDim),
// rounded up to a power of two so that a key's lanes lie within a warp, aligned.
int decode_lanes(std::int64_t D) {
  const std::int64_t per_lane = D > kDecodeWideHeadDim ? 32 : 8, need = (D + per_lane - 1) / per_lane;
  int lanes = 1;
  while (lanes < need) lanes *= 2;
  return lanes;
}

// --------------------------------------------------------------------------- KV cache ops

// Float caches: one thread per (row, kv head, element).
__global__ void kv_write_float_kernel(const float* src, std::uint8_t* cache, std::int64_t rows, std::int64_t Hkv,
                                      std::int64_t D, std::int64_t capacity, std::int64_t slot_bytes,
                                      const std::int64_t* seq, const std::int64_t* slot, const std::int64_t* head_slot,
                                      DType dtype) {
  const std::int64_t total = rows * Hkv * D;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const QuotRem rd = div_rem(e, D), rg = div_rem(rd.quot, Hkv);
    const std::int64_t r = rg.quot, g = rg.rem, d = rd.rem;
    const std::int64_t s = head_slot != nullptr ? head_slot[r * Hkv + g] : slot[r];
    if (s < 0) continue;
    std::uint8_t* dst = cache + ((seq[r] * Hkv + g) * capacity + s) * slot_bytes;
    store_float_elem(dst, dtype, d, src[e]);  // src[e] = src[r * Hkv * D + g * D + d]
  }
}

// Quantized caches: a block of kQuantThreads per (row, kv head, group).
__global__ void kv_write_quant_kernel(const float* src, std::uint8_t* cache, std::int64_t rows, std::int64_t Hkv,
                                      std::int64_t D, std::int64_t capacity, std::int64_t slot_bytes,
                                      const std::int64_t* seq, const std::int64_t* slot, const std::int64_t* head_slot,
                                      bool q4) {
  __shared__ float xs[kQuantGroupSize];
  __shared__ int qs[kQuantGroupSize];
  __shared__ float params[2];
  const std::int64_t groups = (D + kQuantGroupSize - 1) / kQuantGroupSize;
  for (std::int64_t task = blockIdx.x; task < rows * Hkv * groups; task += gridDim.x) {
    const std::int64_t r = task / (Hkv * groups), g = (task / groups) % Hkv, grp = task % groups;
    const std::int64_t s = head_slot != nullptr ? head_slot[r * Hkv + g] : slot[r];
    if (s < 0) continue;  // uniform across the block
    std::uint8_t* dst = cache + ((seq[r] * Hkv + g) * capacity + s) * slot_bytes;
    quantize_group(src + (r * Hkv + g) * D, D, q4, grp, dst, xs, qs, params);
  }
}

// Block per move: byte copy of one slot. Moves of one launch touch distinct slots.
__global__ void kv_move_kernel(std::uint8_t* cache, const std::int64_t* from, const std::int64_t* to,
                               std::int64_t count, std::int64_t slot_bytes) {
  for (std::int64_t mv = blockIdx.x; mv < count; mv += gridDim.x) {
    const std::uint8_t* s = cache + from[mv] * slot_bytes;
    std::uint8_t* d = cache + to[mv] * slot_bytes;
    for (std::int64_t i = threadIdx.x; i < slot_bytes; i += blockDim.x) d[i] = s[i];
  }
}

// Block per query (seq, head, slot, len: 4 values), thread per slot j < len: the cosine of
// the two keys, each sum a sequential fmaf over head_dim.
__global__ void kv_similarity_kernel(const std::uint8_t* cache, const std::int64_t* queries, std::int64_t count,
                                     std::int64_t Hkv, std::int64_t D, std::int64_t capacity, std::int64_t slot_bytes,
                                     DType dtype, float* out) {
  for (std::int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const std::int64_t* q = queries + 4 * i;
    const std::uint8_t* head = cache + (q[0] * Hkv + q[1]) * capacity * slot_bytes;
    const std::uint8_t* src = head + q[2] * slot_bytes;
    for (std::int64_t j = threadIdx.x; j < q[3]; j += blockDim.x) {
      const std::uint8_t* row = head + j * slot_bytes;
      float dot = 0.0f, ns = 0.0f, nr = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) {
        const float x = load_elem(src, dtype, D, d), y = load_elem(row, dtype, D, d);
        dot = __fmaf_rn(x, y, dot);
        ns = __fmaf_rn(x, x, ns);
        nr = __fmaf_rn(y, y, nr);
      }
      const float norms = __fmul_rn(sqrtf(ns), sqrtf(nr));
      out[i * capacity + j] = norms > 0.0f ? __fdiv_rn(dot, norms) : 0.0f;
    }
  }
}

// Thread per (merge m, element d): blended[m * D + d] = (1 - w) * to + w * from, in fp32.
// slots[2 * m] and slots[2 * m + 1]: the from and to slot indices in the cache.
__global__ void kv_merge_blend_kernel(const std::uint8_t* cache, const std::int64_t* slots, const float* weights,
                                      std::int64_t count, std::int64_t D, std::int64_t slot_bytes, DType dtype,
                                      float* blended) {
  const std::int64_t total = count * D;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t m = e / D, d = e % D;
    const float w = weights[m];
    const float from = load_elem(cache + slots[2 * m] * slot_bytes, dtype, D, d);
    const float to = load_elem(cache + slots[2 * m + 1] * slot_bytes, dtype, D, d);
    blended[e] = __fadd_rn(__fmul_rn(1.0f - w, to), __fmul_rn(w, from));
  }
}

// Stores the blended rows into their `to` slots: float caches a thread per element, quantized
// ones a block of kQuantThreads per (merge, group).
__global__ void kv_merge_store_float_kernel(std::uint8_t* cache, const std::int64_t* slots, const float* blended,
                                            std::int64_t count, std::int64_t D, std::int64_t slot_bytes, DType dtype) {
  const std::int64_t total = count * D;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    store_float_elem(cache + slots[2 * (e / D) + 1] * slot_bytes, dtype, e % D, blended[e]);
}
__global__ void kv_merge_store_quant_kernel(std::uint8_t* cache, const std::int64_t* slots, const float* blended,
                                            std::int64_t count, std::int64_t D, std::int64_t slot_bytes, bool q4) {
  __shared__ float xs[kQuantGroupSize];
  __shared__ int qs[kQuantGroupSize];
  __shared__ float params[2];
  const std::int64_t groups = (D + kQuantGroupSize - 1) / kQuantGroupSize;
  for (std::int64_t task = blockIdx.x; task < count * groups; task += gridDim.x) {
    const std::int64_t m = task / groups, grp = task % groups;
    quantize_group(blended + m * D, D, q4, grp, cache + slots[2 * m + 1] * slot_bytes, xs, qs, params);
  }
}

// Tiles of `tile` rows of every sequence, as (first row, sequence) pairs.
std::vector<std::int64_t> row_tiles(std::span<const std::int64_t> offsets, std::int64_t tile) {
  std::vector<std::int64_t> tiles;
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b)
    for (std::int64_t r = offsets[b]; r < offsets[b + 1]; r += tile) {
      tiles.push_back(r);
      tiles.push_back(static_cast<std::int64_t>(b));
    }
  return tiles;
}

std::size_t floats_bytes(std::size_t floats) { return floats * sizeof(float); }

// Under bf16 compute, prefill runs on tensor cores (attention_prefill_mma.cu) for the head dims
// that kernel has; with column sums it stays on the fp32 kernels, whose column-sum pass
// recomputes the very scores the softmax used.
bool prefill_on_tensor_cores(const AttentionPrefillArgs& a) {
  auto aligned = [](const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; };
  return a.compute == DType::BF16 && a.col_sums == nullptr && mma_prefill_has(a.shape.head_dim) && aligned(a.q, 16) &&
         aligned(a.k, 16) && aligned(a.v, 16) && aligned(a.out, 8);
}

// Bytes a DeviceBuffer of `bytes` takes from the pool (none when empty).
std::int64_t scratch_of(std::int64_t bytes) {
  return bytes <= 0 ? 0 : std::max<std::int64_t>(bytes, static_cast<std::int64_t>(kMinScratch));
}

}  // namespace

std::int64_t attention_scratch(const AttentionShape& s, std::int64_t rows, std::int64_t batch, std::int64_t capacity,
                               bool scores, int sm_count) {
  const std::int64_t H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim;
  rows = std::max<std::int64_t>(rows, 0);
  batch = std::max<std::int64_t>(batch, 0);
  // kv_write: sequence and slot per row (per row and head under eviction); kv_move: from and to
  // per move, at most a slot per (row, head) at prefill or per (sequence, head, slot) at decode.
  const std::int64_t kv_write = scratch_of(8 * rows) + scratch_of(8 * rows * (scores ? Hkv : 1));
  const std::int64_t moves = scores ? std::max(rows, batch * capacity) * Hkv : 0;
  // kv_similarity: 4 values per query; kv_merge: 2 slots, a weight and a blended row per merge;
  // at most one query or merge per (sequence, kv head).
  const std::int64_t merges = scores ? batch * Hkv : 0;
  const std::int64_t kv_merge = scratch_of(16 * merges) + scratch_of(4 * merges) + scratch_of(4 * merges * D);
  const std::int64_t kv_ops = std::max({kv_write, 2 * scratch_of(8 * moves), scratch_of(32 * merges), kv_merge});
  // Prefill of at most `rows` sequences: offsets, query tiles, and with the column sums the
  // (m, l) of every row and head, the key tiles and the query weights.
  const std::int64_t tiles = rows / kQueryTile + rows, key_tiles = rows / kKeyTile + rows;
  std::int64_t prefill = scratch_of(8 * (rows + 1)) + scratch_of(16 * tiles);
  if (scores) prefill += scratch_of(8 * rows * H) + scratch_of(16 * key_tiles) + scratch_of(4 * rows);
  // Decode: lens and cache rows, the partials of every (sequence, head, split), and with the probabilities
  // the kept scores and the combined (m, l). Under bf16 compute also the tensor-core tiles of
  // query runs (at most one per kMinTensorCoreRun queries) and the other queries' indices.
  const std::int64_t splits = decode_splits_bound(s, batch, capacity, sm_count);
  const std::int64_t run_tiles = batch / kMinTensorCoreRun;
  std::int64_t decode = 3 * scratch_of(8 * batch) + scratch_of(static_cast<std::int64_t>(sizeof(RunTile)) * run_tiles) +
                        scratch_of(4 * batch * H * splits * D) + scratch_of(8 * batch * H * splits);
  if (scores) decode += scratch_of(4 * batch * H * capacity) + scratch_of(8 * batch * H);
  // With shared prefixes (decode_cascade): suffix starts, member queries, refs, the prefix tasks
  // and their partials; the splits of the own slots are within the partials above.
  const std::int64_t partials = cascade_partials_bound(s, batch);
  decode += 2 * scratch_of(8 * batch) + scratch_of(static_cast<std::int64_t>(sizeof(PrefixRef)) * batch) +
            scratch_of(static_cast<std::int64_t>(sizeof(PrefixTask)) * cascade_tasks_bound(s, batch, prefix_batch_heads(D))) +
            scratch_of(4 * partials * D) + scratch_of(8 * partials);
  return std::max({kv_ops, prefill, decode});
}

void CudaBackend::do_attention_prefill(const AttentionPrefillArgs& a) {
  graph_interrupt();  // its tiles follow the host's offsets: not in a graph
  const AttentionShape& s = a.shape;
  const std::int64_t B = static_cast<std::int64_t>(a.seq_offsets.size()) - 1;
  const std::int64_t T = a.seq_offsets[static_cast<std::size_t>(B)];
  const bool weighted = !a.query_weights.empty();
  if (T <= 0) return;
  const std::int64_t H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim;
  const bool mma = prefill_on_tensor_cores(a);
  const std::size_t shared = mma ? mma_prefill_shared_bytes(D) : floats_bytes(prefill_shared_floats(D));
  allow_shared(mma ? mma_prefill_kernel(D) : reinterpret_cast<const void*>(prefill_kernel), shared, "attention_prefill");
  const std::vector<std::int64_t> tiles = row_tiles(a.seq_offsets, mma ? kMmaQueryTile : kQueryTile);
  const std::int64_t n_tiles = static_cast<std::int64_t>(tiles.size()) / 2;
  const DeviceBuffer offsets = upload(a.seq_offsets);
  const DeviceBuffer tiles_d = upload(std::span<const std::int64_t>(tiles));
  if (mma) {
    launch_mma_prefill({.shape = s, .q = a.q, .k = a.k, .v = a.v, .out = a.out, .tiles = tiles_d.as<std::int64_t>(),
                        .n_tiles = n_tiles, .offsets = offsets.as<std::int64_t>()},
                       stream_);
    return;
  }
  DeviceBuffer stats;
  if (a.col_sums != nullptr) stats = DeviceBuffer(*this, static_cast<std::size_t>(T * H) * 2 * sizeof(float));
  prefill_kernel<<<blocks_for(n_tiles * H, 1), kAttnThreads, shared, stream_>>>(
      a.q, a.k, a.v, a.out, stats.as<float>(), tiles_d.as<std::int64_t>(), n_tiles, offsets.as<std::int64_t>(), H, Hkv,
      D, s.scale, s.softcap, s.window);
  FLEXH2O_CUDA_CHECK_LAUNCH();
  if (a.col_sums != nullptr) {
    const std::size_t col_shared = floats_bytes(col_sums_shared_floats(D));
    allow_shared(reinterpret_cast<const void*>(col_sums_kernel), col_shared, "attention_prefill");
    const std::vector<std::int64_t> key_tiles = row_tiles(a.seq_offsets, kKeyTile);
    const std::int64_t n_key_tiles = static_cast<std::int64_t>(key_tiles.size()) / 2;
    const DeviceBuffer key_tiles_d = upload(std::span<const std::int64_t>(key_tiles));
    DeviceBuffer weights;
    if (weighted) weights = upload(a.query_weights);
    col_sums_kernel<<<blocks_for(n_key_tiles * Hkv, 1), kAttnThreads, col_shared, stream_>>>(
        a.q, a.k, stats.as<float>(), key_tiles_d.as<std::int64_t>(), n_key_tiles, offsets.as<std::int64_t>(),
        weighted ? weights.as<float>() : nullptr, a.col_sums, H, Hkv, D, s.scale, s.softcap, s.window);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
}

namespace {

// The plan of the decode kernel for `queries` of a: as a call of those queries alone.
DecodePlan plan_decode_queries(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries, int sm_count) {
  std::int64_t max_len = 0;
  for (const std::int64_t q : queries) {
    const std::int64_t n = a.lens[static_cast<std::size_t>(q)];
    max_len = std::max(max_len, n - first_visible(n - 1, a.shape.window));
  }
  return plan_decode(a.shape, static_cast<std::int64_t>(queries.size()), decode_planned_keys(max_len, a.capacity),
                     sm_count);
}

}  // namespace

// Runs of queries on one cache row (a chunk of a prompt after cached tokens) go to tensor cores
// under bf16 compute (decode_runs.h: the split, and decode_runs_on_tensor_cores, the one
// predicate for the fallback); the other queries, and every query of a call that falls back,
// to the decode kernel. Members of shared prefixes stay off the tensor cores (which would read
// their prefix through their own rows) and are read in cascade (decode_cascade). Tile and
// cascade tables follow the host's lens, cache_rows and groups, which a replayed graph would not
// re-read: such a call ends the graph step (the engine opens graph steps only for steps without
// prompt rows, so it never has runs there; a step with shared prefixes runs eagerly).
void CudaBackend::do_attention_decode(const AttentionDecodeArgs& a) {
  const bool cascade = reads_in_cascade(a);
  DecodeQuerySplit split;
  if (decode_runs_on_tensor_cores(a)) split = split_decode_queries(a.cache_rows, a.lens, kMinTensorCoreRun, kMmaQueryTile);
  if (cascade) keep_members_off_tiles(a, split);
  if (!split.tiles.empty() || cascade) graph_interrupt();
  if (graph_active() &&
      graph_op(decode_signature(a, sm_count_), a, [this](const AttentionDecodeArgs& d) { do_attention_decode(d); },
               &AttentionDecodeArgs::lens, &AttentionDecodeArgs::cache_rows, &AttentionDecodeArgs::shared_prefixes,
               &AttentionDecodeArgs::prefix_of, &AttentionDecodeArgs::row_base))
    return;
  if (a.lens.empty()) return;
  const std::int64_t D = a.shape.head_dim;
  if (D > kDecodeMaxHeadDim)
    throw std::invalid_argument("attention_decode: head_dim " + std::to_string(D) + " is above the CUDA kernel's " +
                                std::to_string(kDecodeMaxHeadDim));
  // The kernels count positions in int.
  if (std::max(a.capacity, a.prefix_cache.capacity) > std::numeric_limits<int>::max() / 2)
    throw std::invalid_argument("attention_decode: capacity " + std::to_string(std::max(a.capacity, a.prefix_cache.capacity)) +
                                " is above the CUDA kernel's " + std::to_string(std::numeric_limits<int>::max() / 2));
  if (split.tiles.empty()) return decode_on_cuda_cores(a, {});
  decode_runs_on_mma(a, split.tiles);
  if (!split.singles.empty()) decode_on_cuda_cores(a, split.singles);
}

void CudaBackend::decode_runs_on_mma(const AttentionDecodeArgs& a, std::span<const RunTile> tiles) {
  const std::int64_t D = a.shape.head_dim;
  allow_shared(mma_cache_runs_kernel(D, a.cache_dtype), mma_prefill_shared_bytes(D), "attention_decode");
  const DeviceBuffer tiles_d = upload(tiles);
  launch_mma_cache_runs({.shape = a.shape, .q = a.q, .k_cache = a.k_cache, .v_cache = a.v_cache,
                         .cache_dtype = a.cache_dtype, .capacity = a.capacity, .out = a.out,
                         .tiles = tiles_d.as<std::int64_t>(), .n_tiles = static_cast<std::int64_t>(tiles.size())},
                        stream_);
}

void CudaBackend::decode_on_cuda_cores(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries) {
  if (shared_prefix_applies(a)) {
    const CascadeLayout layout = plan_cascade(a, queries, kDecodeMinKeys, prefix_batch_heads(a.shape.head_dim),
                                              kDecodeBlocksPerSm * sm_count_);
    // Members go through the cascade even where no window reaches their prefix (no tasks): a
    // held row starts after its prefix, which only the cascade's suffix starts know.
    if (!layout.member_queries.empty()) return decode_cascade(a, queries, layout);
  }
  decode_queries(a, queries, queries.empty() ? plan_decode(a, sm_count_) : plan_decode_queries(a, queries, sm_count_));
}

namespace {

// The decode kernel's arguments that follow from a and the plan for B sequences; the caller
// sets the device arrays and the output.
DecodeParams decode_params(const AttentionDecodeArgs& a, const DecodePlan& plan, std::int64_t B) {
  const AttentionShape& s = a.shape;
  const std::int64_t D = s.head_dim;
  DecodeParams p;
  p.plan = plan;
  p.q = a.q;
  p.k_cache = static_cast<const std::uint8_t*>(a.k_cache);
  p.v_cache = static_cast<const std::uint8_t*>(a.v_cache);
  p.slot_bias = a.slot_bias;
  p.H = s.n_heads;
  p.Hkv = s.n_kv_heads;
  p.capacity = a.capacity;
  p.slot_bytes = kv_slot_bytes(a.cache_dtype, D);
  p.format = SlotFormat{D, is_quantized(a.cache_dtype) ? quant_code_bytes(a.cache_dtype, D) : 0, a.cache_dtype};
  p.scale = s.scale;
  p.softcap = s.softcap;
  p.window = s.window;
  p.tasks = B * p.Hkv * plan.head_chunks * plan.splits;
  p.lanes = decode_lanes(D);
  p.out = a.out;
  return p;
}

}  // namespace

void CudaBackend::decode_queries(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries,
                                 const DecodePlan& plan) {
  if (!queries.empty() && a.probs != nullptr)  // the probs kernel indexes lens by its sequence
    throw std::logic_error("attention_decode: a subset of the queries with probs");
  const std::int64_t B = static_cast<std::int64_t>(queries.empty() ? a.lens.size() : queries.size());
  const std::int64_t H = a.shape.n_heads, D = a.shape.head_dim;
  DecodeParams p = decode_params(a, plan, B);
  const DeviceBuffer lens = upload(a.lens);
  const DeviceBuffer cache_rows = upload(a.cache_rows);
  const DeviceBuffer query_rows = upload(queries);
  DeviceBuffer part_acc, part_ml, scores, ml;
  if (p.plan.splits > 1) {
    part_acc = DeviceBuffer(*this, static_cast<std::size_t>(B * H * p.plan.splits * D) * sizeof(float));
    part_ml = DeviceBuffer(*this, static_cast<std::size_t>(B * H * p.plan.splits) * 2 * sizeof(float));
  }
  if (a.probs != nullptr) {
    scores = DeviceBuffer(*this, static_cast<std::size_t>(B * H * a.capacity) * sizeof(float));
    ml = DeviceBuffer(*this, static_cast<std::size_t>(B * H) * 2 * sizeof(float));
  }
  p.lens = lens.as<std::int64_t>();
  p.cache_rows = a.cache_rows.empty() ? nullptr : cache_rows.as<std::int64_t>();
  p.query_rows = queries.empty() ? nullptr : query_rows.as<std::int64_t>();
  p.ml = ml.as<float>();
  p.part_acc = part_acc.as<float>();
  p.part_ml = part_ml.as<float>();
  p.scores = scores.as<float>();
  launch_decode(p, stream_);
  FLEXH2O_CUDA_CHECK_LAUNCH();
  if (p.plan.splits > 1) {
    decode_combine_kernel<<<blocks_for(B * H, 1), kAttnThreads, 0, stream_>>>(
        part_acc.as<float>(), part_ml.as<float>(), B * H, p.plan.splits, D, H, p.query_rows, a.out, ml.as<float>(),
        PrefixPartials{});
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
  if (a.probs != nullptr) {
    decode_probs_kernel<<<blocks_for(B * p.Hkv * a.capacity), kThreads, 0, stream_>>>(
        scores.as<float>(), ml.as<float>(), lens.as<std::int64_t>(), B, H, p.Hkv, a.capacity, a.shape.window, a.probs);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
}

// The prefix kernel over a layout's tasks, its partials to acc and ml (as the partials of one
// split: store_heads puts member head i of a task at task.partials + i).
void CudaBackend::decode_prefix_tasks(const AttentionDecodeArgs& a, const CascadeLayout& layout, float* acc,
                                      float* ml) {
  const DeviceBuffer tasks = upload(std::span<const PrefixTask>(layout.tasks));
  const DeviceBuffer members = upload(std::span<const std::int64_t>(layout.member_queries));
  const DeviceBuffer member_first = upload(std::span<const std::int64_t>(layout.member_first));
  DecodePlan plan;
  plan.heads_per_block = prefix_batch_heads(a.shape.head_dim);
  DecodeParams p = decode_params(a, plan, 0);
  if (a.prefix_cache.k != nullptr) {
    p.k_cache = static_cast<const std::uint8_t*>(a.prefix_cache.k);
    p.v_cache = static_cast<const std::uint8_t*>(a.prefix_cache.v);
    p.capacity = a.prefix_cache.capacity;
  }
  p.part_acc = acc;
  p.part_ml = ml;
  const PrefixTables t{tasks.as<PrefixTask>(), static_cast<std::int64_t>(layout.tasks.size()),
                       members.as<std::int64_t>(), member_first.as<std::int64_t>()};
  launch_decode(p, stream_, &t);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

// Cascade attention (decode_cascade.h): the prefix tasks' partials, each query's own slots after
// its prefix (a non-member's whole row) as partials of the decode kernel's splits, and the
// combine of both. Always through partials: a member may have no slot of its own yet. Under a
// sliding window a layout may have no prefix tasks (no member's window reaches its prefix).
void CudaBackend::decode_cascade(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries,
                                 const CascadeLayout& layout) {
  const std::int64_t B = static_cast<std::int64_t>(layout.refs.size());
  const std::int64_t H = a.shape.n_heads, D = a.shape.head_dim;
  const DeviceBuffer prefix_acc(*this, static_cast<std::size_t>(layout.partials * D) * sizeof(float));
  const DeviceBuffer prefix_ml(*this, static_cast<std::size_t>(layout.partials) * 2 * sizeof(float));
  if (!layout.tasks.empty()) decode_prefix_tasks(a, layout, prefix_acc.as<float>(), prefix_ml.as<float>());
  // The kernel reads slots [starts, lens) of each row: a row that starts after its prefix
  // (row_base) holds position x at slot x - row_base.
  std::vector<std::int64_t> row_lens(a.lens.begin(), a.lens.end()), row_starts(layout.suffix_start);
  std::int64_t own = 0;  // the most slots a query reads from its own row
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t q = queries.empty() ? b : queries[static_cast<std::size_t>(b)];
    const std::int64_t base = row_base_of(a, q);
    row_lens[static_cast<std::size_t>(q)] = a.lens[static_cast<std::size_t>(q)] - base;
    row_starts[static_cast<std::size_t>(b)] -= base;
    own = std::max(own, row_lens[static_cast<std::size_t>(q)] - row_starts[static_cast<std::size_t>(b)]);
  }
  DecodeParams p = decode_params(a, plan_decode(a.shape, B, own, sm_count_), B);
  const DeviceBuffer lens = upload(std::span<const std::int64_t>(row_lens)), cache_rows = upload(a.cache_rows),
                     query_rows = upload(queries);
  const DeviceBuffer starts = upload(std::span<const std::int64_t>(row_starts));
  const DeviceBuffer refs = upload(std::span<const PrefixRef>(layout.refs));
  const DeviceBuffer part_acc(*this, static_cast<std::size_t>(B * H * p.plan.splits * D) * sizeof(float));
  const DeviceBuffer part_ml(*this, static_cast<std::size_t>(B * H * p.plan.splits) * 2 * sizeof(float));
  p.lens = lens.as<std::int64_t>();
  p.cache_rows = a.cache_rows.empty() ? nullptr : cache_rows.as<std::int64_t>();
  p.query_rows = queries.empty() ? nullptr : query_rows.as<std::int64_t>();
  p.starts = starts.as<std::int64_t>();
  p.part_acc = part_acc.as<float>();
  p.part_ml = part_ml.as<float>();
  launch_decode(p, stream_);
  FLEXH2O_CUDA_CHECK_LAUNCH();
  const PrefixPartials prefix{prefix_acc.as<float>(), prefix_ml.as<float>(), refs.as<PrefixRef>(), H / a.shape.n_kv_heads};
  decode_combine_kernel<<<blocks_for(B * H, 1), kAttnThreads, 0, stream_>>>(
      part_acc.as<float>(), part_ml.as<float>(), B * H, p.plan.splits, D, H, p.query_rows, a.out, nullptr, prefix);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_kv_write(const KvWriteArgs& a) {
  if (graph_active() && graph_op(signature(a), a, [this](const KvWriteArgs& w) { do_kv_write(w); }, &KvWriteArgs::seq,
                                 &KvWriteArgs::slot, &KvWriteArgs::head_slot))
    return;
  const std::int64_t rows = static_cast<std::int64_t>(a.seq.size()), H = a.n_kv_heads;
  const bool per_head = !a.head_slot.empty();
  const std::int64_t D = a.head_dim;
  if (rows == 0 || H <= 0 || D <= 0) return;
  const std::int64_t slot_bytes = kv_slot_bytes(a.cache_dtype, D);
  const DeviceBuffer seq = upload(a.seq);
  const DeviceBuffer slots = per_head ? upload(a.head_slot) : upload(a.slot);
  const std::int64_t* slot_ptr = per_head ? nullptr : slots.as<std::int64_t>();
  const std::int64_t* head_slot_ptr = per_head ? slots.as<std::int64_t>() : nullptr;
  auto* cache = static_cast<std::uint8_t*>(a.cache);
  if (is_quantized(a.cache_dtype)) {
    const std::int64_t groups = (D + kQuantGroupSize - 1) / kQuantGroupSize;
    kv_write_quant_kernel<<<blocks_for(rows * H * groups, 1), kQuantThreads, 0, stream_>>>(
        a.src, cache, rows, H, D, a.capacity, slot_bytes, seq.as<std::int64_t>(), slot_ptr, head_slot_ptr,
        a.cache_dtype == DType::Q4);
  } else {
    kv_write_float_kernel<<<blocks_for(rows * H * D), kThreads, 0, stream_>>>(
        a.src, cache, rows, H, D, a.capacity, slot_bytes, seq.as<std::int64_t>(), slot_ptr, head_slot_ptr,
        a.cache_dtype);
  }
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_kv_move(const KvMoveArgs& a) {
  graph_interrupt();  // eviction's work: not in a graph
  const std::int64_t slot_bytes = kv_slot_bytes(a.cache_dtype, a.head_dim);
  // Slot indices in the cache; moves that depend on an earlier move of the same call (read
  // or overwrite a slot it touched) start a new launch, so the result is that of applying
  // the moves in order, as the CPU backend does.
  std::vector<std::int64_t> from, to;
  std::vector<std::size_t> launch_starts;
  std::unordered_set<std::int64_t> read, written;
  for (const KvMove& m : a.moves) {
    const std::int64_t head = (m.seq * a.n_kv_heads + m.head) * a.capacity;
    const std::int64_t f = head + m.from, t = head + m.to;
    if (f == t) continue;
    if (from.empty() || written.count(f) || read.count(t) || written.count(t)) {
      launch_starts.push_back(from.size());
      read.clear();
      written.clear();
    }
    read.insert(f);
    written.insert(t);
    from.push_back(f);
    to.push_back(t);
  }
  if (from.empty() || slot_bytes <= 0) return;
  launch_starts.push_back(from.size());
  const DeviceBuffer from_d = upload(std::span<const std::int64_t>(from));
  const DeviceBuffer to_d = upload(std::span<const std::int64_t>(to));
  for (std::size_t i = 0; i + 1 < launch_starts.size(); ++i) {
    const std::int64_t first = static_cast<std::int64_t>(launch_starts[i]);
    const std::int64_t count = static_cast<std::int64_t>(launch_starts[i + 1]) - first;
    kv_move_kernel<<<blocks_for(count, 1), kAttnThreads, 0, stream_>>>(static_cast<std::uint8_t*>(a.cache),
                                                                         from_d.as<std::int64_t>() + first,
                                                                         to_d.as<std::int64_t>() + first, count,
                                                                         slot_bytes);
    FLEXH2O_CUDA_CHECK_LAUNCH();
  }
}

void CudaBackend::do_kv_similarity(const KvSimilarityArgs& a) {
  graph_interrupt();
  std::vector<std::int64_t> queries;
  for (const KvSimilarityQuery& q : a.queries) queries.insert(queries.end(), {q.seq, q.head, q.slot, q.len});
  if (queries.empty() || a.head_dim <= 0) return;
  const std::int64_t count = static_cast<std::int64_t>(a.queries.size());
  const DeviceBuffer queries_d = upload(std::span<const std::int64_t>(queries));
  kv_similarity_kernel<<<blocks_for(count, 1), kAttnThreads, 0, stream_>>>(
      static_cast<const std::uint8_t*>(a.cache), queries_d.as<std::int64_t>(), count, a.n_kv_heads, a.head_dim,
      a.capacity, kv_slot_bytes(a.cache_dtype, a.head_dim), a.cache_dtype, a.out);
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

void CudaBackend::do_kv_merge(const KvMergeArgs& a) {
  graph_interrupt();
  std::vector<std::int64_t> slots;
  std::vector<float> weights;
  for (const KvMerge& m : a.merges) {
    const std::int64_t head = (m.seq * a.n_kv_heads + m.head) * a.capacity;
    slots.insert(slots.end(), {head + m.from, head + m.to});
    weights.push_back(m.weight);
  }
  const std::int64_t count = static_cast<std::int64_t>(weights.size()), D = a.head_dim;
  if (count == 0 || D <= 0) return;
  const std::int64_t slot_bytes = kv_slot_bytes(a.cache_dtype, D);
  const DeviceBuffer slots_d = upload(std::span<const std::int64_t>(slots));
  const DeviceBuffer weights_d = upload(std::span<const float>(weights));
  DeviceBuffer blended(*this, static_cast<std::size_t>(count * D) * sizeof(float));
  auto* cache = static_cast<std::uint8_t*>(a.cache);
  kv_merge_blend_kernel<<<blocks_for(count * D), kThreads, 0, stream_>>>(
      cache, slots_d.as<std::int64_t>(), weights_d.as<float>(), count, D, slot_bytes, a.cache_dtype, blended.as<float>());
  FLEXH2O_CUDA_CHECK_LAUNCH();
  if (is_quantized(a.cache_dtype)) {
    const std::int64_t groups = (D + kQuantGroupSize - 1) / kQuantGroupSize;
    kv_merge_store_quant_kernel<<<blocks_for(count * groups, 1), kQuantThreads, 0, stream_>>>(
        cache, slots_d.as<std::int64_t>(), blended.as<float>(), count, D, slot_bytes, a.cache_dtype == DType::Q4);
  } else {
    kv_merge_store_float_kernel<<<blocks_for(count * D), kThreads, 0, stream_>>>(
        cache, slots_d.as<std::int64_t>(), blended.as<float>(), count, D, slot_bytes, a.cache_dtype);
  }
  FLEXH2O_CUDA_CHECK_LAUNCH();
}

}  // namespace flexh2o::kernels::cuda
