// The next weight tile's stored bytes, brought towards the caches by the tiled GEMM kernels
// (gemm_tiled_cpu.cc, gemm_tiled_bf16_cpu.cc) a few lines per micro-kernel call: spread over
// the current tile's compute so that the next tile's widening finds them there, without filling
// the miss queues that the activations' loads also need.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace flexh2o::kernels {

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

}  // namespace flexh2o::kernels
