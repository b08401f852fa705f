// GEMM for decode-sized batches (a few to a few hundred activation rows) that reads the
// weights as stored, with no fp32 copy of a weight panel: a tile of kTiledWeightRows weight
// rows over a chunk of k is widened to fp32 once, in registers, into a buffer that stays in L1
// (fp16 by F16C, bf16 by a shift, q4/q8 codes as q * s + m with their group's scale and
// minimum), and every activation row is then multiplied with it by a register-blocked FMA
// kernel (4 weight rows x 3 activation rows = 12 accumulators). The activations are walked in
// chunks of k small enough to stay in L2 while all the tiles of a block of weight rows use them;
// the chunks depend on k alone, so a row's outputs are the same bits whatever the other rows.
// AVX2 + FMA + F16C; gemm_cpu.cc takes oneDNN elsewhere.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"

namespace flexh2o::kernels {

constexpr std::int64_t kTiledWeightRows = 4;
// Weight rows per parallel task: its rows share each pass over a chunk of x.
constexpr std::int64_t kTiledTaskRows = 64;

// Whether gemm_tiled can run `a` here: f32 compute, f32/f16/bf16/q4/q8/q4g32/q8g32 weights,
// m >= 1, and a CPU with AVX2, FMA and F16C.
bool gemm_tiled_supported(const GemmArgs& a);
// y = x w^T (+ bias) (+ y), rows [n0, n1) of w.
void gemm_tiled(const GemmArgs& a, std::int64_t n0, std::int64_t n1);

}  // namespace flexh2o::kernels
