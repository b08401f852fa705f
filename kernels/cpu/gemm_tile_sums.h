// Where the tiled GEMM kernels (gemm_tiled_cpu.cc, gemm_int8_cpu.cc) leave their results: a
// tile's sums over one chunk of k, four consecutive outputs of one activation row, added into y.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/gemm.h"

namespace flexh2o::kernels {

// y[i, r + j] for j < rows gets lane j of sums: the first chunk (first) starts from the bias and
// beta * y, later ones add to y.
inline void add_tile_sums(const GemmArgs& a, std::int64_t i, std::int64_t r, int rows, bool first, __m128 sums) {
  if (rows == 4) {  // whole tiles, in vectors: the same additions as the scalar loop below
    float* y = a.y + i * a.w.rows + r;
    if (first && a.bias) sums = _mm_add_ps(sums, _mm_loadu_ps(a.bias + r));
    if (!first || a.beta != 0.0f) sums = _mm_add_ps(_mm_loadu_ps(y), sums);
    _mm_storeu_ps(y, sums);
    return;
  }
  alignas(16) float v[4];
  _mm_store_ps(v, sums);
  float* y = a.y + i * a.w.rows + r;
  for (int j = 0; j < rows; ++j) {
    if (!first) {
      y[j] += v[j];
      continue;
    }
    const float s = a.bias ? v[j] + a.bias[r + j] : v[j];
    y[j] = a.beta != 0.0f ? y[j] + s : s;
  }
}

}  // namespace flexh2o::kernels
