// Splits a template into text and the tokens of its tags, with jinja2's whitespace rules as
// transformers configures them: trim_blocks (the newline after a block or comment tag goes),
// lstrip_blocks (spaces and tabs before a block or comment tag on its own line go), `-` at a
// tag's edge strips all whitespace on that side, `+` turns lstrip/trim off for that edge.
// Newlines are normalised to \n and one trailing newline is dropped, as jinja2 does.
#pragma once
#include <string>
#include <vector>

namespace flexh2o::engine::chat {

enum class TokenType {
  Text,           // template text between tags
  VariableBegin,  // {{
  VariableEnd,    // }}
  BlockBegin,     // {%
  BlockEnd,       // %}
  Name,
  String,  // value: the unescaped string
  Integer,
  Float,
  Operator,  // value: the operator text
  End,
};

struct Token {
  TokenType type;
  std::string value;
  int line;
};

// Throws TemplateError with the line on an unterminated tag, string or comment.
std::vector<Token> tokenize(const std::string& source);

}  // namespace flexh2o::engine::chat
