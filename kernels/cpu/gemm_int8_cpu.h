// GEMM of 4- and 8-bit group weights (q4, q8, q4g32, q8g32: kernels/quantize.h) with integer
// dot products, as llama.cpp multiplies GGUF blocks: each activation row is quantized per block
// of 32 values to int8 codes with one fp32 scale (dx = max |x| / 127, code = round(x / dx)),
// and each weight group's dot product with it is
//   s * sum over its blocks of dx * sum(q * code)  +  m * sum(x)
// with the code products summed exactly in integers (AVX2 vpmaddubsw / vpmaddwd) and the
// minimum's term taken from the activations' exact fp32 sum. The only error beyond fp32
// rounding is the activations' rounding to codes: at most dx / 2 per value.
// Tiles of 4 weight rows over a chunk of k are unpacked once into an L1 buffer of byte codes
// and used by every activation row, as in gemm_tiled_cpu.h.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/gemm.h"

namespace flexh2o::kernels {

// Activation rows quantized per block of 32 values.
struct Int8Rows {
  std::int64_t m = 0, k = 0;
  std::vector<std::int8_t> codes;  // [m, k]
  std::vector<float> scale;        // [m, k / 32]: dx of each block
  std::vector<float> sum;          // [m, k / 32]: the block's fp32 sum of x
};
constexpr std::int64_t kInt8Block = 32;

// Whether gemm_int8 can run `a` here: f32 compute, 4- or 8-bit group weights, k a multiple of
// 32, m >= 1, and a CPU with AVX2, FMA and F16C.
bool gemm_int8_supported(const GemmArgs& a);
// Rows [i0, i1) of x [m, k] into q (sized for m x k beforehand by resize_int8_rows).
void resize_int8_rows(std::int64_t m, std::int64_t k, Int8Rows& q);
void quantize_int8_rows(const float* x, std::int64_t i0, std::int64_t i1, Int8Rows& q);
// Whether this CPU has AVX-512 VNNI (on 256-bit vectors), which gemm_int8 then uses: the
// same integer sums in fewer instructions.
bool int8_vnni_available();
// y = x w^T (+ bias) (+ y), rows [n0, n1) of w, with x given as q (quantize_int8_rows of a.x);
// vnni (where available) picks the VNNI instructions, otherwise AVX2's.
void gemm_int8(const GemmArgs& a, const Int8Rows& q, std::int64_t n0, std::int64_t n1,
               bool vnni = int8_vnni_available());

}  // namespace flexh2o::kernels
