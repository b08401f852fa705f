// The lexical rules shared by JSON grammars (whitespace, strings, any value) and the strings
// of a schema (lengths, pattern, format), each rule defined once per grammar.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/grammar.h"

namespace flexh2o::grammar {

class JsonStrings {
 public:
  JsonStrings(GrammarBuilder& builder, std::uint32_t max_whitespace)
      : builder_(builder), max_whitespace_(max_whitespace) {}
  Expr ws();
  Expr any_string();
  Expr any_value();
  Expr any_object();
  // A string under the schema's minLength/maxLength, pattern or format.
  Expr string_expr(const nlohmann::ordered_json& schema, const std::string& path);
  // A string other than the `names`, written without escapes (so no escape spells a name).
  Expr key_not_in(const std::vector<std::string>& names);

 private:
  Expr shared(std::optional<std::uint32_t>& rule, const char* name, Expr (JsonStrings::*body)());
  Expr ws_body();
  Expr char_body();
  Expr plain_char_body();
  Expr string_body();
  Expr value_body();
  Expr object_body();
  Expr array_body();
  Expr string_char() { return shared(char_, "char", &JsonStrings::char_body); }
  Expr plain_char() { return shared(plain_char_, "plain-char", &JsonStrings::plain_char_body); }

  GrammarBuilder& builder_;
  std::uint32_t max_whitespace_;
  std::optional<std::uint32_t> ws_, char_, plain_char_, string_, value_, object_, array_;
};

}  // namespace flexh2o::grammar
