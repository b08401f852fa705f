// The op tests' fixture: random inputs from --gtest_random_seed, which stays on the failure
// trace for the whole test (a SCOPED_TRACE that lives as long as the fixture), so a failure
// reruns with --gtest_random_seed=N. Also stores fp32 rows in any dtype.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace flexh2o::kernels {

class SeededTest : public ::testing::Test {
 protected:
  std::vector<float> random_floats(std::int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& e : v) e = dist(rng_);
    return v;
  }
  std::vector<std::uint8_t> random_bytes(std::int64_t n) {
    std::uniform_int_distribution<int> dist(0, 255);
    std::vector<std::uint8_t> v(static_cast<std::size_t>(n));
    for (auto& e : v) e = static_cast<std::uint8_t>(dist(rng_));
    return v;
  }
  std::int64_t random_int(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }

  const unsigned seed_ = static_cast<unsigned>(::testing::UnitTest::GetInstance()->random_seed());
  const ::testing::ScopedTrace seed_trace_{
      __FILE__, __LINE__,
      "random seed " + std::to_string(seed_) + " (reproduce with --gtest_random_seed=" + std::to_string(seed_) + ")"};
  std::mt19937 rng_{seed_};
};

// Rows of `cols` fp32 values stored as `t` (any dtype, quantized included).
inline std::vector<std::uint8_t> stored_rows(const std::vector<float>& values, DType t, std::int64_t rows,
                                             std::int64_t cols) {
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows * row_bytes(t, cols)));
  convert_rows(values.data(), DType::F32, bytes.data(), t, rows, cols);
  return bytes;
}

}  // namespace flexh2o::kernels
