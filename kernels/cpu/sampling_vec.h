// The vocabulary-wide passes of the CPU sampler (sampling_cpu.cc): a row's largest logit, the
// softmax's normaliser and the tokens within a range of logits. Each has an AVX-512 and an AVX2+FMA
// path chosen at run time; the plain loops are their reference and the path of other CPUs. Each
// pass also takes the instruction set to use, so that the tests run every path this CPU has.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace flexh2o::kernels::sampling_vec {

using kernels::Isa;
// The instruction sets this CPU has, the plain loops first; a pass given another one throws.
std::vector<Isa> supported_isas();

// The largest of z[0..n), n >= 1, for rows without NaN.
float max_of(const float* z, std::int64_t n);
float max_of(Isa isa, const float* z, std::int64_t n);

struct ExpSum {
  double total = 0.0;         // the sum of the terms
  std::int64_t positive = 0;  // the terms that do not underflow to 0
};

// The sum over i of exp(double(z[i] - mx) / temperature), mx the row's largest logit and
// temperature > 0. The reference takes std::exp of each term and sums them in index order.
ExpSum exp_sum_reference(const float* z, std::int64_t n, float mx, double temperature);
// The same sum, vectorised: each term within (kExpTermUlps + 2 |x|) units of 2^-53 of exp(x)
// relative (x the term's exponent: the reciprocal of the temperature rounds twice), summed in
// another order. Terms below exp(-700), where the vector exp would leave the normal range, are
// the reference's own, so `positive` equals the reference's.
ExpSum exp_sum(const float* z, std::int64_t n, float mx, double temperature);
ExpSum exp_sum(Isa isa, const float* z, std::int64_t n, float mx, double temperature);
// Range reduction, the degree-13 Taylor polynomial (truncation < 0.04 units for |r| <= ln2/2)
// and its Horner steps: a generous bound of one term's error, in units of 2^-53.
inline constexpr double kExpTermUlps = 6.0;

// The indices i of z[0..n) with low <= z[i] < high, ascending (`out` is replaced).
void indices_in(const float* z, std::int64_t n, float low, float high, std::vector<std::int32_t>& out);
void indices_in(Isa isa, const float* z, std::int64_t n, float low, float high, std::vector<std::int32_t>& out);

}  // namespace flexh2o::kernels::sampling_vec
