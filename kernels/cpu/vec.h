// Short fp32 vector loops of the CPU kernels (softmax and similarity over a KV cache, SiLU), with
// an AVX2+FMA path chosen at run time: the binary runs on any x86-64, and uses 8-wide FMAs where it can.
#pragma once
#include <cstdint>

namespace flexh2o::kernels::vec {

// sum_i a[i] * b[i]
float dot(const float* a, const float* b, std::int64_t n);
// sum_i a[i] * b[i] and sum_i b[i] * b[i] in one pass over b (a cosine against many rows)
void dot_and_square(const float* a, const float* b, std::int64_t n, float& ab, float& bb);

// max_i x[i] (-inf for n = 0)
float max(const float* x, std::int64_t n);
// x[i] = exp(x[i] - shift) for x[i] <= shift; returns the sum. The vector path's exp is within
// 2 ulp of std::exp, and 0 where std::exp underflows to a subnormal (below 2^-126).
float exp_shifted(float* x, std::int64_t n, float shift);
// x[i] *= s
void scale(float* x, std::int64_t n, float s);
// out[i] = silu(gate[i]) * up[i] (up null: silu(gate[i])), silu(x) = x / (1 + exp(-x)); out may
// alias gate or up. The vector path uses exp_shifted's exp (within 2 ulp), as x exp(x/2)^2 below
// x = -80: within a few ulp of the exact value wherever that is a normal fp32.
void silu_times(const float* gate, const float* up, float* out, std::int64_t n);

}  // namespace flexh2o::kernels::vec
