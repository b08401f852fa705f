// Sets of Unicode code points (regex classes, JSON string characters) and their UTF-8 byte
// sequences as grammar expressions.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/grammar/expr.h"

namespace flexh2o::grammar {

constexpr std::uint32_t kMaxCodePoint = 0x10FFFF;

class CharSet {
 public:
  CharSet() = default;
  static CharSet range(std::uint32_t lo, std::uint32_t hi) {
    CharSet s;
    s.add(lo, hi);
    return s;
  }
  void add(std::uint32_t lo, std::uint32_t hi);
  void add(const CharSet& other);
  // Code points of [0, kMaxCodePoint] outside this set (surrogates never included).
  CharSet complement() const;
  CharSet minus(const CharSet& other) const { return intersect(other.complement()); }
  CharSet intersect(const CharSet& other) const;
  bool contains(std::uint32_t cp) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<std::uint32_t, std::uint32_t>>& ranges() const { return ranges_; }

 private:
  void normalize();
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges_;  // sorted, disjoint, inclusive
};

// One code point of `set` as UTF-8 bytes (surrogates excluded), as alternatives of byte-range
// sequences.
Expr utf8_expr(const CharSet& set);
std::string utf8_encode(std::uint32_t cp);

}  // namespace flexh2o::grammar
