#include "engine/grammar/json_numbers.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace flexh2o::grammar {

namespace {

Expr digit_class(char lo, char hi) {
  return bytes_expr(ByteClass::range(static_cast<std::uint8_t>(lo), static_cast<std::uint8_t>(hi)));
}

// Digit strings of one length between lo and hi (same length, lo <= hi), leading zeros kept.
Expr same_length_range(const std::string& lo, const std::string& hi) {
  const std::size_t n = lo.size();
  if (n == 1) return digit_class(lo[0], hi[0]);
  if (lo == std::string(n, '0') && hi == std::string(n, '9')) return repeat(digit_class('0', '9'), static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(n));
  if (lo[0] == hi[0]) return seq({digit_class(lo[0], lo[0]), same_length_range(lo.substr(1), hi.substr(1))});
  std::vector<Expr> options;
  options.push_back(seq({digit_class(lo[0], lo[0]), same_length_range(lo.substr(1), std::string(n - 1, '9'))}));
  if (lo[0] + 1 <= hi[0] - 1)
    options.push_back(seq({digit_class(static_cast<char>(lo[0] + 1), static_cast<char>(hi[0] - 1)),
                           repeat(digit_class('0', '9'), static_cast<std::uint32_t>(n - 1), static_cast<std::uint32_t>(n - 1))}));
  options.push_back(seq({digit_class(hi[0], hi[0]), same_length_range(std::string(n - 1, '0'), hi.substr(1))}));
  return alt(std::move(options));
}

std::uint64_t pow10(std::size_t digits) {
  std::uint64_t p = 1;
  for (std::size_t i = 0; i < digits; ++i) p *= 10;
  return p;
}

// Non-negative integers in [lo, hi] (hi absent: open), written without leading zeros.
Expr natural_range(std::uint64_t lo, std::optional<std::uint64_t> hi) {
  std::vector<Expr> options;
  const std::size_t lo_digits = std::to_string(lo).size();
  const std::size_t hi_digits = hi ? std::to_string(*hi).size() : 19;
  for (std::size_t d = lo_digits; d <= hi_digits; ++d) {
    const std::uint64_t first = d == lo_digits ? lo : pow10(d - 1);
    if (!hi && d == 19) {  // lo <= 1e18: every number of 19 digits or more
      options.push_back(seq({digit_class('1', '9'), repeat(digit_class('0', '9'), 18, Expr::kUnbounded)}));
      break;
    }
    const std::uint64_t last = (hi && d == hi_digits) ? *hi : pow10(d) - 1;
    options.push_back(same_length_range(std::to_string(first), std::to_string(last)));
  }
  return alt(std::move(options));
}

constexpr std::int64_t kBoundLimit = 1'000'000'000'000'000'000;  // keeps -lo and hi + 1 in range

void check_bounds(std::optional<std::int64_t> lo, std::optional<std::int64_t> hi) {
  if ((lo && (*lo < -kBoundLimit || *lo > kBoundLimit)) || (hi && (*hi < -kBoundLimit || *hi > kBoundLimit)))
    throw std::invalid_argument("a numeric bound beyond 1e18");
  if (lo && hi && *lo > *hi)
    throw std::invalid_argument("bounds that no integer satisfies (" + std::to_string(*lo) + " > " + std::to_string(*hi) + ")");
}

Expr fraction() { return seq({literal("."), repeat(digit_class('0', '9'), 1, Expr::kUnbounded)}); }

}  // namespace

Expr integer_range_expr(std::optional<std::int64_t> lo, std::optional<std::int64_t> hi) {
  check_bounds(lo, hi);
  std::vector<Expr> options;
  if (!lo || *lo < 0) {  // -n for n in [max(1, -hi), -lo]
    const std::uint64_t n_lo = (hi && *hi < 0) ? static_cast<std::uint64_t>(-*hi) : 1;
    std::optional<std::uint64_t> n_hi;
    if (lo) n_hi = static_cast<std::uint64_t>(-*lo);
    options.push_back(seq({literal("-"), natural_range(n_lo, n_hi)}));
  }
  if (!hi || *hi >= 0) {
    std::optional<std::uint64_t> top;
    if (hi) top = static_cast<std::uint64_t>(*hi);
    options.push_back(natural_range(lo && *lo > 0 ? static_cast<std::uint64_t>(*lo) : 0, top));
  }
  return alt(std::move(options));
}

Expr any_number_expr() {
  Expr exponent = seq({bytes_expr(ByteClass::of("eE")), optional(bytes_expr(ByteClass::of("+-"))),
                       repeat(digit_class('0', '9'), 1, 2)});
  return seq({optional(literal("-")), natural_range(0, std::nullopt), optional(fraction()), optional(std::move(exponent))});
}

namespace {

// Magnitudes m = I or I.F with lo < m (or <=) and m < hi (or <=), lo >= 0: integers in the
// closed range, fractions with I strictly inside, and I = lo with a nonzero fraction when lo is
// exclusive.
Expr magnitude_expr(NumberBound lo, std::optional<NumberBound> hi) {
  const std::int64_t int_lo = lo.value + (lo.exclusive ? 1 : 0);
  std::optional<std::int64_t> int_hi, frac_hi;
  if (hi) int_hi = hi->value - (hi->exclusive ? 1 : 0), frac_hi = hi->value - 1;
  std::vector<Expr> options;
  if (!int_hi || int_lo <= *int_hi) options.push_back(integer_range_expr(int_lo, int_hi));
  if (!frac_hi || int_lo <= *frac_hi) options.push_back(seq({integer_range_expr(int_lo, frac_hi), fraction()}));
  if (lo.exclusive && (!hi || lo.value < hi->value)) {
    Expr nonzero_fraction = seq({literal("."), star(digit_class('0', '9')), digit_class('1', '9'), star(digit_class('0', '9'))});
    options.push_back(seq({integer_range_expr(lo.value, lo.value), std::move(nonzero_fraction)}));
  }
  if (options.empty()) return alt({});
  return alt(std::move(options));
}

}  // namespace

Expr number_range_expr(std::optional<NumberBound> lo, std::optional<NumberBound> hi) {
  check_bounds(lo ? std::optional(lo->value) : std::nullopt, hi ? std::optional(hi->value) : std::nullopt);
  std::vector<Expr> options;
  // x >= 0: m = x within [max(lo, 0), hi].
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    const NumberBound m_lo = lo && lo->value >= 0 ? *lo : NumberBound{0, false};
    options.push_back(magnitude_expr(m_lo, hi));
  }
  // x < 0: m = -x within (max(-hi, 0), -lo], "-0" left out.
  if (!lo || lo->value < 0) {
    const NumberBound m_lo = hi && hi->value < 0 ? NumberBound{-hi->value, hi->exclusive} : NumberBound{0, true};
    std::optional<NumberBound> m_hi;
    if (lo) m_hi = NumberBound{-lo->value, lo->exclusive};
    options.push_back(seq({literal("-"), magnitude_expr(m_lo, m_hi)}));
  }
  std::erase_if(options, [](const Expr& e) { return e.kind == Expr::Kind::Alt && e.items.empty(); });
  if (options.empty()) throw std::invalid_argument("number bounds that no value satisfies");
  return alt(std::move(options));
}

}  // namespace flexh2o::grammar
