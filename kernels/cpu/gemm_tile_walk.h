// The walk over weight tiles shared by the tiled GEMM kernels (gemm_tiled_cpu.cc,
// gemm_tiled_bf16_cpu.cc), and the prefetch of the next tile's stored bytes while one is used.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace flexh2o::kernels {

// Columns per chunk of k: k in equal chunks of at most max_chunk, each rounded up to a multiple
// of `multiple`. It depends on k alone: the chunks fix each output's summation order, so a row's
// result does not depend on how many other rows share the GEMM.
inline std::int64_t equal_chunks(std::int64_t k, std::int64_t max_chunk, std::int64_t multiple) {
  const std::int64_t chunks = (k + max_chunk - 1) / max_chunk;
  return std::min(k, ((k + chunks - 1) / chunks + multiple - 1) / multiple * multiple);
}

// The next tile's stored bytes, brought towards the caches a few lines per micro-kernel call:
// spread over the current tile's compute so that the next tile's widening finds them there,
// without filling the miss queues that the activations' loads also need.
template <int Rows>
struct TilePrefetch {
  const std::uint8_t* row[Rows] = {};  // where each next row's bytes start; null: nothing to fetch
  std::int64_t lines_per_row = 0, next = 0;

  void issue(std::int64_t count) {
    for (const std::int64_t end = std::min(next + count, Rows * lines_per_row); next < end; ++next) {
      const std::uint8_t* p = row[next / lines_per_row];
      if (p) _mm_prefetch(reinterpret_cast<const char*>(p + 64 * (next % lines_per_row)), _MM_HINT_T0);
    }
  }
  void issue_all() { issue(Rows * lines_per_row); }
};

// Weight rows [b0, b1) of a matrix stored at `base` (rb bytes a row), chunk by chunk of kc of its
// k columns, tile by tile of R rows: fill(j, row, c0, len) brings columns [c0, c0 + len) of the
// stored row `row` into the tile's row j (a short last tile repeats its last row; its extra sums
// are dropped), then multiply(r, rows, c0, len, prefetch) multiplies the tile while `prefetch`
// brings in the next one. byte_of(c): where column c starts in a stored row.
template <int R, class ByteOf, class Fill, class Multiply>
void walk_tiles(const std::uint8_t* base, std::int64_t rb, std::int64_t k, std::int64_t kc, std::int64_t b0,
                std::int64_t b1, ByteOf&& byte_of, Fill&& fill, Multiply&& multiply) {
  for (std::int64_t c0 = 0; c0 < k; c0 += kc) {
    const std::int64_t len = std::min(kc, k - c0);
    for (std::int64_t r = b0; r < b1; r += R) {
      const int rows = static_cast<int>(std::min<std::int64_t>(R, b1 - r));
      for (int j = 0; j < R; ++j) fill(j, base + (r + std::min(j, rows - 1)) * rb, c0, len);
      TilePrefetch<R> prefetch;  // the block's next tile in this chunk
      if (r + R < b1) {
        const std::int64_t from = byte_of(c0) / 64 * 64;
        prefetch.lines_per_row = (byte_of(c0 + len) - from + 63) / 64;
        for (int j = 0; j < R && r + R + j < b1; ++j) prefetch.row[j] = base + (r + R + j) * rb + from;
      }
      multiply(r, rows, c0, len, prefetch);
    }
  }
}

}  // namespace flexh2o::kernels
