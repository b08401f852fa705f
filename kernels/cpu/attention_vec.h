// The loops of the CPU decode attention over the cached slots of one (sequence, kv head), for
// all the query heads of its group at once: each key and value is loaded, and widened from f16
// or bf16 in registers, once for up to three heads, rather than converted into an fp32 block
// first. An AVX2+FMA+F16C path chosen at run time; the plain loops are its reference and the
// path of other CPUs. Each loop also takes the instruction set to use, so that the tests run
// every path this CPU has.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/dtype.h"

namespace flexh2o::kernels::attention_vec {

// The paths these loops have on this CPU, the plain loops first; a loop given another throws.
std::vector<Isa> supported_isas();

// m cached slots of d values each, back to back, in `dtype`: f32, f16 or bf16.
struct Slots {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::int64_t m = 0, d = 0;
};

// scores[h * ld + j] = scale * sum_i q[h * d + i] * k_j[i], for heads h < heads and slots j < m.
// The vector path sums the first d / 8 * 8 products in 8 lanes (i by 8s, in order), adds the
// lanes as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), then the last d % 8 products one at a time;
// the plain loops add the products in order.
void scores(const float* q, std::int64_t heads, const Slots& keys, float scale, float* scores, std::int64_t ld);
void scores(Isa isa, const float* q, std::int64_t heads, const Slots& keys, float scale, float* scores,
            std::int64_t ld);

// acc[h * d + i] += sum_j w[h * ld + j] * v_j[i], for heads h < heads: each acc[h * d + i]
// takes its m terms in order of j, by fused multiply-adds on the vector path.
void weighted_sum(const float* w, std::int64_t ld, std::int64_t heads, const Slots& values, float* acc);
void weighted_sum(Isa isa, const float* w, std::int64_t ld, std::int64_t heads, const Slots& values, float* acc);

}  // namespace flexh2o::kernels::attention_vec
