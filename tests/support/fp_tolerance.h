// Tolerances derived from floating-point arithmetic, so that a check holds on every CPU and
// summation order (OpenBLAS picks its kernels by CPU model at run time, oneDNN by ISA, a GPU
// splits reductions its own way) and still fails on a real defect, which is off by O(1).
//
// u is the unit roundoff of a type (half the gap between 1 and the next value). A sum of k
// terms computed in any order differs from the exact sum by about u * sqrt(k) times the size
// of the result when the rounding errors are independent (random walk), and by at most
// u * (k - 1) * sum |t_i| in the worst case. Two implementations that order the same sum
// differently differ by about twice the first. kSlack covers that factor of two, the norm
// and exp steps around a reduction, and the gap between the random-walk estimate and a
// short unlucky sum.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

namespace flexh2o::testing {

constexpr double kF32Eps = 0x1p-24;   // fp32: 24-bit significand
constexpr double kF16Eps = 0x1p-11;   // fp16: 11-bit significand
constexpr double kBF16Eps = 0x1p-8;   // bf16: 8-bit significand
constexpr double kSlack = 8.0;

// |got - want| allowed for a sum of k terms whose result has magnitude `scale`, computed in
// a type of unit roundoff u (in any order).
inline double sum_tolerance(double u, std::int64_t k, double scale) {
  return kSlack * u * std::sqrt(static_cast<double>(std::max<std::int64_t>(k, 1))) * std::max(1.0, scale);
}

// The largest |x| of a span: the magnitude a model's logits are compared at (a logit's error
// comes from the whole residual stream, not from its own size).
inline double max_abs(std::span<const float> x) {
  double m = 0;
  for (float v : x) m = std::max(m, std::abs(static_cast<double>(v)));
  return m;
}

}  // namespace flexh2o::testing
