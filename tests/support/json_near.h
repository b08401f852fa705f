// Result lines compared where log-probabilities may differ in their last bits: runs that put a
// request beside other rows (another batch, a resumed job, another rank) may change a GEMM's
// summation order, so its logits, and their log-softmax, differ by fp32 rounding.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace flexh2o::testing {

// Expects `got` to be `want`: the same structure, strings and integers, and numbers with a
// fraction within `tolerance`. `at` names the place in failure messages.
inline void expect_json_near(const nlohmann::json& got, const nlohmann::json& want, double tolerance,
                             const std::string& at) {
  if (got.is_number_float() || want.is_number_float()) {
    if (!got.is_number() || !want.is_number()) {
      ADD_FAILURE() << at << ": " << got << " vs " << want;
      return;
    }
    EXPECT_NEAR(got.get<double>(), want.get<double>(), tolerance) << at;
  } else if (got.is_object() && want.is_object() && got.size() == want.size()) {
    for (const auto& [key, value] : want.items()) {
      if (got.contains(key)) expect_json_near(got[key], value, tolerance, at + "." + key);
      else ADD_FAILURE() << at << " has no " << key;
    }
  } else if (got.is_array() && want.is_array() && got.size() == want.size()) {
    for (std::size_t i = 0; i < want.size(); ++i)
      expect_json_near(got[i], want[i], tolerance, at + "[" + std::to_string(i) + "]");
  } else {
    EXPECT_EQ(got, want) << at;
  }
}

}  // namespace flexh2o::testing
