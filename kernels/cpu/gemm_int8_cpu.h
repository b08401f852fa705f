// GEMM of 4- and 8-bit group weights (q4, q8, q4g32, q8g32: kernels/quantize.h) with integer
// dot products, as llama.cpp multiplies GGUF blocks: each activation row is quantized per block
// of 32 values to int8 codes with one fp32 scale (dx = max |x| / 127, code = round(x / dx)),
// and each weight group's dot product with it is
//   s * sum over its blocks of dx * sum(q * code)  +  m * sum(x)
// with the code products summed exactly in integers (AVX2 vpmaddubsw / vpmaddwd) and the
// minimum's term taken from the activations' exact fp32 sum. The only error beyond fp32
// rounding is the activations' rounding to codes: at most dx / 2 per value.
// Two kernels compute it. AVX2 (vpmaddubsw, or VNNI's vpdpbusd on 256-bit vectors): tiles of
// 4 weight rows over a chunk of k are unpacked once into an L1 buffer of byte codes and used by
// every activation row, as in gemm_tiled_cpu.h. AVX-512 VNNI (gemm_int8_avx512_cpu.cc): tiles
// of 32 weight rows over the whole of k, transposed so that one 512-bit vector holds 4 codes of
// each of 16 rows; every activation row's 4 codes are broadcast against it, so a block's 32
// products of 16 rows take 8 vpdpbusd with no horizontal sums.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/gemm.h"

namespace flexh2o::kernels {

// Activation rows quantized per block of 32 values.
struct Int8Rows {
  std::int64_t m = 0, k = 0;
  // Each block's codes in the order its kernel unpacks 4-bit weights: as x (false), or its 16
  // even-indexed values then its 16 odd ones (true: the AVX-512 kernel with 4-bit weights).
  bool even_odd = false;
  std::vector<std::int8_t> codes;      // [m, k]
  std::vector<float> scale;            // [m, k / 32]: dx of each block
  std::vector<float> sum;              // [m, k / 32]: the block's fp32 sum of x
  std::vector<std::int32_t> code_sum;  // [m, k / 32]: the sum of the block's codes
};
constexpr std::int64_t kInt8Block = 32;

// The instructions gemm_int8 multiplies with.
enum class Int8Kernel {
  Avx2,        // vpmaddubsw + vpmaddwd, 4-row tiles
  Vnni256,     // vpdpbusd on 256-bit vectors, 4-row tiles
  Avx512Vnni,  // vpdpbusd on 512-bit vectors, transposed 32-row tiles
};
bool int8_kernel_available(Int8Kernel kernel);
// The fastest kernel this CPU has (Avx2 where it has no VNNI).
Int8Kernel int8_best_kernel();

// Whether gemm_int8 can run `a` here: f32 compute, 4- or 8-bit group weights, k a multiple of
// 32, m >= 1, and a CPU with AVX2, FMA and F16C.
bool gemm_int8_supported(const GemmArgs& a);
// Sizes q for m x k values in the block order `kernel` reads for weights of dtype w.
void resize_int8_rows(std::int64_t m, std::int64_t k, Int8Rows& q, Int8Kernel kernel, DType w);
// Rows [i0, i1) of x [m, k] into q (sized beforehand by resize_int8_rows).
void quantize_int8_rows(const float* x, std::int64_t i0, std::int64_t i1, Int8Rows& q);
// y = x w^T (+ bias) (+ y), rows [n0, n1) of w, with x given as q (quantize_int8_rows of a.x,
// sized for the same kernel); throws std::invalid_argument where this CPU lacks `kernel`.
void gemm_int8(const GemmArgs& a, const Int8Rows& q, std::int64_t n0, std::int64_t n1,
               Int8Kernel kernel = int8_best_kernel());

// The AVX-512 VNNI kernel (gemm_int8_avx512_cpu.cc), rows [n0, n1) of w.
void gemm_int8_avx512(const GemmArgs& a, const Int8Rows& q, std::int64_t n0, std::int64_t n1);
// Weight rows per tile of the AVX-512 kernel; gemm_cpu.cc's tasks take multiples of it.
constexpr std::int64_t kInt8Avx512TileRows = 32;

}  // namespace flexh2o::kernels
