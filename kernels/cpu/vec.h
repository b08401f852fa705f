// Short fp32 vector loops of the CPU kernels (attention over a KV cache), with an AVX2+FMA
// path chosen at run time: the binary runs on any x86-64, and uses 8-wide FMAs where it can.
#pragma once
#include <cstdint>

namespace flexh2o::kernels::vec {

// sum_i a[i] * b[i]
float dot(const float* a, const float* b, std::int64_t n);
// sum_i a[i] * b[i] and sum_i b[i] * b[i] in one pass over b (a cosine against many rows)
void dot_and_square(const float* a, const float* b, std::int64_t n, float& ab, float& bb);
// y[i] += s * x[i]
void axpy(float s, const float* x, float* y, std::int64_t n);

}  // namespace flexh2o::kernels::vec
