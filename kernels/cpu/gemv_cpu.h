// GEMM with a few activation rows (decode at small batch), memory-bound: each weight row is
// read once in its stored dtype (fp16 and bf16 widened in registers, never copied) and dotted
// with every activation row, so 16-bit weights move half the bytes of fp32 ones. AVX2 + FMA +
// F16C; gemm_cpu.cc falls back to oneDNN where the CPU lacks them.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"

namespace flexh2o::kernels {

constexpr std::int64_t kGemvMaxRows = 4;

// Whether gemv_small_m can run `a` here: f32 compute, fp32/fp16/bf16 weights, m <= kGemvMaxRows,
// and a CPU with AVX2, FMA and F16C.
bool gemv_small_m_applies(const GemmArgs& a);
// y = x w^T (+ bias) (+ y), rows [n0, n1) of w.
void gemv_small_m(const GemmArgs& a, std::int64_t n0, std::int64_t n1);

}  // namespace flexh2o::kernels
