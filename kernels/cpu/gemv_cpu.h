// GEMM with few activation rows (decode at small batch), memory-bound: each weight row is
// read in its stored dtype (fp16 and bf16 widened in registers, q8 codes expanded to q * s + m
// in registers, never copied) and dotted with the activation rows in fp32, so 16-bit weights
// move half the bytes of fp32 ones and q8 weights about a quarter. AVX2 + FMA + F16C;
// gemm_cpu.cc takes oneDNN where the CPU lacks them.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"

namespace flexh2o::kernels {

// The most activation rows gemv_small_m takes for weights of type t: where it stops beating
// oneDNN on weight panels (measured side by side on AVX2, n 8192 x k 2048): fp32 weights,
// which oneDNN reads in place, up to 8 rows; 16-bit and q8 weights, which oneDNN needs
// converted, up to 16.
constexpr std::int64_t gemv_max_rows(DType t) { return t == DType::F32 ? 8 : 16; }

// Whether gemv_small_m can run `a` here: f32 compute, fp32/fp16/bf16/q8/q8g32 weights,
// 1 <= m <= gemv_max_rows, and a CPU with AVX2, FMA and F16C.
bool gemv_small_m_applies(const GemmArgs& a);
// y = x w^T (+ bias) (+ y), rows [n0, n1) of w.
void gemv_small_m(const GemmArgs& a, std::int64_t n0, std::int64_t n1);

}  // namespace flexh2o::kernels
