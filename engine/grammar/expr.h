// Grammar expressions: what regexes, GBNF rules, choices and JSON schemas are translated into
// before grammar.h lowers them to rules of byte classes and rule references.
#pragma once
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "engine/grammar/byte_class.h"

namespace flexh2o::grammar {

struct Expr {
  enum class Kind { Bytes, Seq, Alt, Rule, Repeat };
  static constexpr std::uint32_t kUnbounded = std::numeric_limits<std::uint32_t>::max();

  Kind kind = Kind::Seq;
  ByteClass bytes;          // Bytes: one byte of this class
  std::vector<Expr> items;  // Seq: in order; Alt: one of; Repeat: items[0]
  std::uint32_t rule = 0;   // Rule: a reference to a rule by id
  std::uint32_t min = 0;    // Repeat: items[0] between min and max times
  std::uint32_t max = 0;
};

inline Expr empty_expr() { return Expr{.kind = Expr::Kind::Seq}; }
inline Expr bytes_expr(const ByteClass& bytes) { return Expr{.kind = Expr::Kind::Bytes, .bytes = bytes}; }
inline Expr rule_expr(std::uint32_t rule) { return Expr{.kind = Expr::Kind::Rule, .rule = rule}; }
inline Expr seq(std::vector<Expr> items) { return Expr{.kind = Expr::Kind::Seq, .items = std::move(items)}; }
inline Expr alt(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  return Expr{.kind = Expr::Kind::Alt, .items = std::move(items)};
}
inline Expr repeat(Expr item, std::uint32_t min, std::uint32_t max) {
  return Expr{.kind = Expr::Kind::Repeat, .items = {std::move(item)}, .min = min, .max = max};
}
inline Expr optional(Expr item) { return repeat(std::move(item), 0, 1); }
inline Expr star(Expr item) { return repeat(std::move(item), 0, Expr::kUnbounded); }
inline Expr literal(std::string_view text) {
  Expr e = empty_expr();
  for (char c : text) e.items.push_back(bytes_expr(ByteClass::single(static_cast<std::uint8_t>(c))));
  return e;
}

}  // namespace flexh2o::grammar
