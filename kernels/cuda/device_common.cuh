// Device helpers shared by the CUDA kernels (included by the *_gpu.cu files only):
// launch sizes, element loads/stores in every storage dtype, the quantized row format of
// kernels/quantize.h, and block reductions.
//
// Conversions that the CPU backend performs with separately rounded fp32 operations use the
// __fmul_rn/__fadd_rn/__fsub_rn/__fdiv_rn intrinsics here, which nvcc never fuses into FMAs,
// so dequantized and quantized values match kernels/quantize.cc bit for bit.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/quantize_code.h"

namespace flexh2o::kernels::cuda {

constexpr int kThreads = 256;       // element-wise kernels
constexpr int kQuantThreads = 64;   // one thread per value of a quantization group (kQuantGroup)
constexpr int kQuantGroupSize = 64; // = kQuantGroup, as a device-usable constant (the largest group)

// Blocks for a grid-stride loop over n items at `per_block` items per block: enough to fill
// any GPU, never more than the grid limit. Kernels loop, so any n is covered.
inline unsigned blocks_for(std::int64_t n, std::int64_t per_block = kThreads) {
  const std::int64_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}

// e / n and e % n of an element loop's index: in 32 bits where both fit, which is every loop but
// the largest (a 64-bit division is a software routine several times as long).
struct QuotRem {
  std::int64_t quot, rem;
};
__device__ __forceinline__ QuotRem div_rem(std::int64_t e, std::int64_t n) {
  if (((e | n) >> 31) == 0) {
    const auto a = static_cast<std::uint32_t>(e), b = static_cast<std::uint32_t>(n);
    return {static_cast<std::int64_t>(a / b), static_cast<std::int64_t>(a % b)};
  }
  return {e / n, e % n};
}

// ---------------------------------------------------------------- float types

__device__ __forceinline__ float f16_bits_to_f32(std::uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf16_bits_to_f32(std::uint16_t b) {
  return __uint_as_float(static_cast<unsigned>(b) << 16);
}

// As kernels::f32_to_f16: round to nearest even, overflow to inf, NaN -> sign | 0x7e00.
__device__ __forceinline__ std::uint16_t f32_to_f16_bits(float f) {
  if (isnan(f)) return static_cast<std::uint16_t>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
  return __half_as_ushort(__float2half_rn(f));
}

// As kernels::f32_to_bf16 (same integer arithmetic).
__device__ __forceinline__ std::uint16_t f32_to_bf16_bits(float f) {
  unsigned x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

// Little-endian 16-bit load/store at any byte address (quantized rows are not aligned).
__device__ __forceinline__ std::uint16_t load_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (static_cast<unsigned>(p[1]) << 8));
}
__device__ __forceinline__ void store_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v & 0xffu);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}

// ---------------------------------------------------------------- quantized rows

__device__ __forceinline__ std::int64_t q_code_bytes(bool q4, std::int64_t n) { return q4 ? (n * 4 + 7) / 8 : n; }

// Element i of a quantized row of n values in groups of `group`: q * scale + min, rounded as
// the CPU does.
__device__ __forceinline__ float dequant_at(const std::uint8_t* row, std::int64_t n, bool q4, int group,
                                            std::int64_t i) {
  const std::uint8_t* params = row + q_code_bytes(q4, n) + 4 * (i / group);
  const float s = f16_bits_to_f32(load_u16(params));
  const float m = f16_bits_to_f32(load_u16(params + 2));
  const unsigned q = q4 ? (row[i / 2] >> (4 * (i % 2))) & 0xfu : row[i];
  return __fadd_rn(__fmul_rn(static_cast<float>(q), s), m);
}

// Element i of a row of n values stored as `t` (any dtype).
__device__ __forceinline__ float load_elem(const std::uint8_t* row, DType t, std::int64_t n, std::int64_t i) {
  switch (t) {
    case DType::F32: return reinterpret_cast<const float*>(row)[i];
    case DType::F16: return f16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(row)[i]);
    case DType::BF16: return bf16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(row)[i]);
    case DType::Q4: return dequant_at(row, n, true, kQuantGroupSize, i);
    case DType::Q8: return dequant_at(row, n, false, kQuantGroupSize, i);
    case DType::Q4G32: return dequant_at(row, n, true, 32, i);
    case DType::Q8G32: return dequant_at(row, n, false, 32, i);
  }
  return 0.0f;
}

// Stores element i of a row of a float dtype (F32/F16/BF16).
__device__ __forceinline__ void store_float_elem(std::uint8_t* row, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::F32: reinterpret_cast<float*>(row)[i] = v; return;
    case DType::F16: reinterpret_cast<std::uint16_t*>(row)[i] = f32_to_f16_bits(v); return;
    case DType::BF16: reinterpret_cast<std::uint16_t*>(row)[i] = f32_to_bf16_bits(v); return;
    case DType::Q4:
    case DType::Q8:
    case DType::Q4G32:
    case DType::Q8G32: return;  // quantized rows are written a group at a time (quantize_group)
  }
}

// std::clamp(f, -65504, 65504), NaN passing through as it does there.
__device__ __forceinline__ float clamp_f16_range(float f) { return f < -65504.0f ? -65504.0f : (65504.0f < f ? 65504.0f : f); }

// The nearest fp16 at or below / at or above f, as quantize.cc's f16_down / f16_up.
__device__ __forceinline__ std::uint16_t f16_down(float f) {
  f = clamp_f16_range(f);
  std::uint16_t h = f32_to_f16_bits(f);
  if (f16_bits_to_f32(h) > f)
    h = (h & 0x7fffu) == 0 ? 0x8001u : (h & 0x8000u) ? static_cast<std::uint16_t>(h + 1) : static_cast<std::uint16_t>(h - 1);
  return h;
}
__device__ __forceinline__ std::uint16_t f16_up(float f) {
  f = clamp_f16_range(f);
  std::uint16_t h = f32_to_f16_bits(f);
  if (f16_bits_to_f32(h) < f)
    h = (h & 0x7fffu) == 0 ? 0x0001u : (h & 0x8000u) ? static_cast<std::uint16_t>(h - 1) : static_cast<std::uint16_t>(h + 1);
  return h;
}

// Quantizes group `grp` (of `group` <= kQuantGroupSize values) of the n-value fp32 row x into
// the quantized row `out`, exactly as quantize_row does. Called by all kQuantThreads threads of
// a block (it synchronises); xs, qs and params are __shared__ scratch of kQuantGroupSize,
// kQuantGroupSize and 2 entries.
__device__ __forceinline__ void quantize_group(const float* x, std::int64_t n, bool q4, std::int64_t grp,
                                               std::uint8_t* out, float* xs, int* qs, float* params,
                                               int group = kQuantGroupSize) {
  const int t = static_cast<int>(threadIdx.x);
  const std::int64_t g0 = grp * group;
  const int len = static_cast<int>(n - g0 < group ? n - g0 : group);
  const int levels = q4 ? 15 : 255;
  __syncthreads();  // the previous group's readers are done with the scratch
  if (t < len) xs[t] = x[g0 + t];
  __syncthreads();
  if (t == 0) {
    float lo = 0.0f, hi = 0.0f;
    quant_group_range(xs, len, lo, hi);
    const std::uint16_t min_h = f16_down(lo);
    const float m = f16_bits_to_f32(min_h);
    const std::uint16_t scale_h = f16_up(__fdiv_rn(__fsub_rn(hi, m), static_cast<float>(levels)));
    const float s = f16_bits_to_f32(scale_h);
    std::uint8_t* p = out + q_code_bytes(q4, n) + 4 * grp;
    store_u16(p, scale_h);
    store_u16(p + 2, min_h);
    params[0] = m;
    params[1] = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
  }
  __syncthreads();
  if (t < len) qs[t] = quant_code(quant_position(xs[t], params[0], params[1]), levels);
  __syncthreads();
  if (t < len) {
    if (!q4) {
      out[g0 + t] = static_cast<std::uint8_t>(qs[t]);
    } else if (t % 2 == 0) {  // groups start at even elements, so a byte never spans two groups
      const int hi_nibble = t + 1 < len ? qs[t + 1] : 0;
      out[(g0 + t) / 2] = static_cast<std::uint8_t>(qs[t] | (hi_nibble << 4));
    }
  }
}

// ---------------------------------------------------------------- 16-byte row access

// Row kernels move V consecutive values at a time: V = 4 (one 16-byte load or store of fp32,
// 8 bytes of bf16) where every pointer and the row length allow (vector_rows), else V = 1.
inline bool aligned_to(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

template <int V>
__device__ __forceinline__ void load_floats(const float* p, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
    for (int i = 0; i < V; ++i) v[i] = p[i];
  }
}

template <int V>
__device__ __forceinline__ void store_floats(float* p, const float (&v)[V]) {
  if constexpr (V == 4)
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  else
    for (int i = 0; i < V; ++i) p[i] = v[i];
}

// v rounded to bf16 as f32_to_bf16_bits does.
template <int V>
__device__ __forceinline__ void store_bf16(std::uint16_t* p, const float (&v)[V]) {
  if constexpr (V == 4) {
    const auto pair = [&](int i) { return f32_to_bf16_bits(v[i]) | (static_cast<unsigned>(f32_to_bf16_bits(v[i + 1])) << 16); };
    *reinterpret_cast<uint2*>(p) = make_uint2(pair(0), pair(2));
  } else {
    for (int i = 0; i < V; ++i) p[i] = f32_to_bf16_bits(v[i]);
  }
}

// A thread's part of a row for the one-block-per-row kernels: group u of the part starting at
// column c0 holds the V values from column c0 + (u * blockDim.x + threadIdx.x) * V (present
// where that is below the row's length). All kRowUnroll groups are loaded before any is used,
// so their loads are in flight together (a row's worth for a block at 16-byte loads).
constexpr int kRowUnroll = 8;

template <int V>
struct RowPart {
  float v[kRowUnroll][V];
  __device__ static std::int64_t col(std::int64_t c0, int u) {
    return c0 + (static_cast<std::int64_t>(u) * blockDim.x + threadIdx.x) * V;
  }
  // Columns a part covers: a block's threads times V times kRowUnroll.
  __device__ static std::int64_t span() { return static_cast<std::int64_t>(blockDim.x) * V * kRowUnroll; }
  __device__ void load(const float* row, std::int64_t cols, std::int64_t c0) {
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u)
      if (col(c0, u) < cols) load_floats<V>(row + col(c0, u), v[u]);
  }
};

// ---------------------------------------------------------------- reductions

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;  // complete in lane 0
}

// Sum over the block (blockDim.x a multiple of 32), returned to every thread. Deterministic:
// the per-warp partials are added in warp order by every thread. `scratch`: __shared__ T[32].
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  v = warp_sum(v);
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  __syncthreads();  // a previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = 0;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

}  // namespace flexh2o::kernels::cuda
