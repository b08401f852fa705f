// JSON numbers as grammar expressions: integers within exact bounds, and numbers within bounds
// rounded inward to integers (docs/structured-output.md, "Numbers").
#pragma once
#include <cstdint>
#include <optional>

#include "engine/grammar/expr.h"

namespace flexh2o::grammar {

// Decimal integers in [lo, hi] (an absent bound is open), without leading zeros or "-0".
// An empty range throws std::invalid_argument.
Expr integer_range_expr(std::optional<std::int64_t> lo, std::optional<std::int64_t> hi);

// Any JSON number (sign, integer part, fraction, exponent).
Expr any_number_expr();

// Numbers without exponent whose value lies in [lo, hi] (integers; absent = open): an integer
// part in [lo, hi - 1] with an optional fraction, or an integer in [lo, hi].
Expr number_range_expr(std::optional<std::int64_t> lo, std::optional<std::int64_t> hi);

}  // namespace flexh2o::grammar
