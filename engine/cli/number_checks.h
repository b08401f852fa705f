// Validators for numeric flags that CLI11's own checks let through: NaN passes CLI::Range
// (every comparison with it is false), and an unsigned option takes "-1" or a number past
// 2^64 - 1 as 2^64 - 1.
#pragma once
#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

namespace flexh2o::cli {

// A finite number (no nan, inf).
inline const CLI::Validator kFiniteNumber(
    [](std::string& text) {
      try {
        std::size_t used = 0;
        const double v = std::stod(text, &used);
        if (used == text.size() && std::isfinite(v)) return std::string();
      } catch (const std::exception&) {
      }
      return "'" + text + "' is not a finite number";
    },
    "FINITE");

// An integer in [0, 2^64 - 1], written in decimal digits.
inline const CLI::Validator kUint64(
    [](std::string& text) {
      std::uint64_t v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (!text.empty() && ec == std::errc() && end == text.data() + text.size()) return std::string();
      return "'" + text + "' is not an integer in [0, 18446744073709551615]";
    },
    "UINT64");

}  // namespace flexh2o::cli
