#include "kernels/cpu/attention_vec.h"

#include <immintrin.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/float_lanes.h"

namespace flexh2o::kernels::attention_vec {

namespace {

const bool kHasAvx2 = cpu_has_avx2_fma_f16c();
const Isa kIsa = kHasAvx2 ? Isa::Avx2 : Isa::Scalar;

Isa checked(Isa isa) {
  if (isa == Isa::Avx512 || (isa == Isa::Avx2 && !kHasAvx2))
    throw std::invalid_argument("attention_vec: no path for the instruction set asked for on this CPU");
  return isa;
}

// Calls f.template operator()<T>() for the slots' dtype.
template <class F>
void with_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f.template operator()<DType::F32>();
    case DType::F16: return f.template operator()<DType::F16>();
    case DType::BF16: return f.template operator()<DType::BF16>();
    default: throw std::invalid_argument("attention_vec: slots in " + std::string(dtype_name(t)) + " (expected f32, f16 or bf16)");
  }
}

template <DType T>
void scores_plain(const float* q, std::int64_t heads, const Slots& k, float scale, float* out, std::int64_t ld) {
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t j = 0; j < k.m; ++j) {
      float s = 0.0f;
      for (std::int64_t i = 0; i < k.d; ++i) s += q[h * k.d + i] * stored_float<T>(k.data, j * k.d + i);
      out[h * ld + j] = scale * s;
    }
}

template <DType T>
void weighted_sum_plain(const float* w, std::int64_t ld, std::int64_t heads, const Slots& v, float* acc) {
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t j = 0; j < v.m; ++j)
      for (std::int64_t i = 0; i < v.d; ++i) acc[h * v.d + i] += w[h * ld + j] * stored_float<T>(v.data, j * v.d + i);
}

// The scores of H heads for slots [j, j + R): H x R accumulators, so each key vector is loaded
// once for the H heads (q's vectors come from L1 as the FMAs' memory operands).
template <DType T, int H, int R>
__attribute__((target("avx2,fma,f16c"))) void score_tile(const float* q, const Slots& k, std::int64_t j, float scale,
                                                          float* out, std::int64_t ld) {
  constexpr int kLanes = R < 4 ? 4 : R;  // hsum4 reads four rows; those past R stay 0
  const void* const keys = k.data;
  const std::int64_t d = k.d, vd = d / 8 * 8;
  __m256 acc[H][kLanes];
  for (auto& head : acc)
    for (auto& a : head) a = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < vd; i += 8)
    for (int r = 0; r < R; ++r) {
      const __m256 key = load8_floats<T>(keys, (j + r) * d + i);
      for (int h = 0; h < H; ++h) acc[h][r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + i), key, acc[h][r]);
    }
  for (int h = 0; h < H; ++h)
    for (int r0 = 0; r0 < R; r0 += 4) {
      alignas(16) float sums[4];
      _mm_store_ps(sums, hsum4(acc[h][r0], acc[h][r0 + 1], acc[h][r0 + 2], acc[h][r0 + 3]));
      for (int r = r0; r < std::min(R, r0 + 4); ++r) {
        float s = sums[r - r0];
        for (std::int64_t i = vd; i < d; ++i) s += q[h * d + i] * stored_float<T>(keys, (j + r) * d + i);
        out[h * ld + j + r] = scale * s;
      }
    }
}

// Up to three heads at a time (12 accumulators of 4 slots, 8 slots for one head); slots past
// the last whole tile one at a time, through the same sums.
template <DType T, int H>
__attribute__((target("avx2,fma,f16c"))) void score_heads(const float* q, const Slots& k, float scale, float* out,
                                                           std::int64_t ld) {
  constexpr int R = H == 1 ? 8 : 4;
  std::int64_t j = 0;
  for (; j + R <= k.m; j += R) score_tile<T, H, R>(q, k, j, scale, out, ld);
  for (; j < k.m; ++j) score_tile<T, H, 1>(q, k, j, scale, out, ld);
}

// Columns [i, i + 8 C) of H heads' sums over all m slots: H x C accumulators in registers, each
// value vector loaded once for the H heads.
template <DType T, int H, int C>
__attribute__((target("avx2,fma,f16c"))) void weighted_tile(const float* w, std::int64_t ld, const Slots& v,
                                                             std::int64_t i, float* acc) {
  const void* const values = v.data;
  const std::int64_t d = v.d, m = v.m;
  // Without slots nothing changes; returning first also keeps GCC 12 from storing every
  // accumulator to memory on every slot.
  if (m <= 0) return;
  __m256 a[H][C];
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) a[h][c] = _mm256_loadu_ps(acc + h * d + i + 8 * c);
  for (std::int64_t j = 0; j < m; ++j) {
    __m256 wj[H];
    for (int h = 0; h < H; ++h) wj[h] = _mm256_broadcast_ss(w + h * ld + j);
    for (int c = 0; c < C; ++c) {
      const __m256 value = load8_floats<T>(values, j * d + i + 8 * c);
      for (int h = 0; h < H; ++h) a[h][c] = _mm256_fmadd_ps(wj[h], value, a[h][c]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + h * d + i + 8 * c, a[h][c]);
}

// Columns by blocks of 32 (64 for one head), then of 8, then one at a time.
template <DType T, int H>
__attribute__((target("avx2,fma,f16c"))) void weighted_heads(const float* w, std::int64_t ld, const Slots& v,
                                                              float* acc) {
  constexpr int C = H == 1 ? 8 : 4;
  const std::int64_t d = v.d;
  std::int64_t i = 0;
  for (; i + 8 * C <= d; i += 8 * C) weighted_tile<T, H, C>(w, ld, v, i, acc);
  for (; i + 8 <= d; i += 8) weighted_tile<T, H, 1>(w, ld, v, i, acc);
  for (; i < d; ++i)
    for (int h = 0; h < H; ++h)
      for (std::int64_t j = 0; j < v.m; ++j) acc[h * d + i] += w[h * ld + j] * stored_float<T>(v.data, j * d + i);
}

// Calls f.template operator()<H>(h) for the heads [h, h + H) of `heads`, by threes.
template <class F>
void by_three_heads(std::int64_t heads, F&& f) {
  for (std::int64_t h = 0; h < heads; h += 3) {
    const std::int64_t n = std::min<std::int64_t>(3, heads - h);
    if (n == 3)
      f.template operator()<3>(h);
    else if (n == 2)
      f.template operator()<2>(h);
    else
      f.template operator()<1>(h);
  }
}

}  // namespace

std::vector<Isa> supported_isas() {
  std::vector<Isa> has = {Isa::Scalar};
  if (kHasAvx2) has.push_back(Isa::Avx2);
  return has;
}

void scores(Isa isa, const float* q, std::int64_t heads, const Slots& keys, float scale, float* out, std::int64_t ld) {
  with_dtype(keys.dtype, [&]<DType T>() {
    if (checked(isa) == Isa::Scalar) return scores_plain<T>(q, heads, keys, scale, out, ld);
    by_three_heads(heads, [&]<int H>(std::int64_t h) { score_heads<T, H>(q + h * keys.d, keys, scale, out + h * ld, ld); });
  });
}

void scores(const float* q, std::int64_t heads, const Slots& keys, float scale, float* out, std::int64_t ld) {
  scores(kIsa, q, heads, keys, scale, out, ld);
}

void weighted_sum(Isa isa, const float* w, std::int64_t ld, std::int64_t heads, const Slots& values, float* acc) {
  with_dtype(values.dtype, [&]<DType T>() {
    if (checked(isa) == Isa::Scalar) return weighted_sum_plain<T>(w, ld, heads, values, acc);
    by_three_heads(heads, [&]<int H>(std::int64_t h) { weighted_heads<T, H>(w + h * ld, ld, values, acc + h * values.d); });
  });
}

void weighted_sum(const float* w, std::int64_t ld, std::int64_t heads, const Slots& values, float* acc) {
  weighted_sum(kIsa, w, ld, heads, values, acc);
}

}  // namespace flexh2o::kernels::attention_vec
