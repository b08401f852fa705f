// JSON numbers as grammar expressions: integers within exact bounds, and numbers within integer
// bounds (docs/structured-output.md, "Numbers").
#pragma once
#include <cstdint>
#include <optional>

#include "engine/grammar/expr.h"

namespace flexh2o::grammar {

// Decimal integers in [lo, hi] (an absent bound is open), without leading zeros or "-0".
// An empty range throws std::invalid_argument.
Expr integer_range_expr(std::optional<std::int64_t> lo, std::optional<std::int64_t> hi);

// Any JSON number (sign, integer part, fraction, exponent of at most two digits, so that every
// number written fits a double).
Expr any_number_expr();

struct NumberBound {
  std::int64_t value = 0;
  bool exclusive = false;
};

// Numbers without exponent between the bounds (absent: unbounded on that side): every such
// integer, and every I.F with a fraction, except those whose integer part is an inclusive upper
// bound (I.0 written as I).
Expr number_range_expr(std::optional<NumberBound> lo, std::optional<NumberBound> hi);

}  // namespace flexh2o::grammar
