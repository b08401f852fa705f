// The tiled GEMM under bf16 compute (GemmArgs::compute BF16) for fp32, fp16 and bf16 weights, on CPUs
// with AVX-512 BF16: vdpbf16ps multiplies two bf16 pairs a lane per instruction and sums them
// in fp32, twice the fp32 FMA's rate, so a decode step's GEMMs run at up to twice the speed of
// the fp32 tiled kernel (gemm_tiled_cpu.h), with the products of oneDNN's bf16 path: x and w
// rounded to bf16 (nearest even), their exact products summed in fp32 (in another order).
// The walk is the fp32 kernel's: a tile of kTiledWeightRows weight rows over a chunk of k (fp32
// and fp16 rounded to bf16, bf16 copied, into an L1 buffer), every activation row multiplied
// with it by a register-blocked kernel (4 weight rows x 6 activation rows of 16 lanes). The
// chunks depend on k alone, so a row's outputs are the same bits whatever the other rows.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"

namespace flexh2o::kernels {

// Whether gemm_tiled_bf16 can run `a` here: bf16 compute, f32/f16/bf16 weights, m >= 1, and a CPU
// with AVX-512 F/BW/VL/BF16.
bool gemm_tiled_bf16_supported(const GemmArgs& a);
// The stride of the rows of x_bf16 below (k values and padding).
std::int64_t tiled_bf16_x_stride(std::int64_t k);
// y = x w^T (+ bias) (+ y) for rows [n0, n1) of w, with x_bf16 = a.x rounded to bf16 (m rows of
// k at tiled_bf16_x_stride(k)).
void gemm_tiled_bf16(const GemmArgs& a, const std::uint16_t* x_bf16, std::int64_t n0, std::int64_t n1);

}  // namespace flexh2o::kernels
