#include "engine/grammar/char_set.h"

#include <algorithm>

namespace flexh2o::grammar {

void CharSet::add(std::uint32_t lo, std::uint32_t hi) {
  ranges_.emplace_back(lo, std::min(hi, kMaxCodePoint));
  normalize();
}

void CharSet::add(const CharSet& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  normalize();
}

void CharSet::normalize() {
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<std::uint32_t, std::uint32_t>> merged;
  for (auto [lo, hi] : ranges_) {
    if (lo > hi) continue;
    if (!merged.empty() && lo <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, hi);
    else merged.emplace_back(lo, hi);
  }
  ranges_ = std::move(merged);
}

CharSet CharSet::complement() const {
  CharSet out;
  std::uint32_t next = 0;
  for (auto [lo, hi] : ranges_) {
    if (lo > next) out.ranges_.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.ranges_.emplace_back(next, kMaxCodePoint);
  return out;
}

CharSet CharSet::intersect(const CharSet& other) const {
  CharSet out;
  for (auto [a_lo, a_hi] : ranges_)
    for (auto [b_lo, b_hi] : other.ranges_)
      if (std::max(a_lo, b_lo) <= std::min(a_hi, b_hi)) out.ranges_.emplace_back(std::max(a_lo, b_lo), std::min(a_hi, b_hi));
  out.normalize();
  return out;
}

bool CharSet::contains(std::uint32_t cp) const {
  return std::any_of(ranges_.begin(), ranges_.end(), [&](auto r) { return r.first <= cp && cp <= r.second; });
}

std::string utf8_encode(std::uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

namespace {

// [lo, hi] of one encoded length, split until every piece is a sequence of byte ranges (the
// utf8-ranges construction: a piece spans whole continuation-byte blocks or one of them).
void split_same_length(std::uint32_t lo, std::uint32_t hi, std::vector<Expr>& out) {
  const std::size_t length = utf8_encode(lo).size();
  for (std::size_t i = 1; i < length; ++i) {
    const std::uint32_t m = (std::uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_same_length(lo, lo | m, out);
        split_same_length((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_same_length(lo, (hi & ~m) - 1, out);
        split_same_length(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = utf8_encode(lo), b = utf8_encode(hi);
  Expr piece = empty_expr();
  for (std::size_t k = 0; k < a.size(); ++k)
    piece.items.push_back(bytes_expr(ByteClass::range(static_cast<std::uint8_t>(a[k]), static_cast<std::uint8_t>(b[k]))));
  out.push_back(std::move(piece));
}

}  // namespace

Expr utf8_expr(const CharSet& set) {
  const CharSet valid = set.minus(CharSet::range(0xD800, 0xDFFF));
  std::vector<Expr> pieces;
  ByteClass ascii;
  for (auto [lo, hi] : valid.ranges()) {
    for (std::uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu, kMaxCodePoint}) {
      if (lo > boundary) continue;
      const std::uint32_t end = std::min(hi, boundary);
      if (boundary == 0x7F) ascii.add_range(static_cast<std::uint8_t>(lo), static_cast<std::uint8_t>(end));
      else split_same_length(lo, end, pieces);
      if (end == hi) break;
      lo = end + 1;
    }
  }
  if (!ascii.empty()) pieces.insert(pieces.begin(), bytes_expr(ascii));
  return alt(std::move(pieces));
}

}  // namespace flexh2o::grammar
