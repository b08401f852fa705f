#include "engine/grammar/gbnf.h"

#include <map>
#include <stdexcept>
#include <string>

#include "engine/grammar/char_set.h"
#include "engine/grammar/regex.h"

namespace flexh2o::grammar {

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  Grammar parse() {
    skip_space();
    while (!done()) {
      const std::string name = rule_name();
      skip_space();
      if (text_.substr(at_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
      at_ += 3;
      const std::uint32_t rule = rule_id(name);
      if (builder_.defined(rule)) fail("rule '" + name + "' is defined twice");
      builder_.define(rule, alternation());
      skip_space();
    }
    auto root = rules_.find("root");
    if (root == rules_.end()) throw std::invalid_argument("grammar: no 'root' rule");
    for (const auto& [name, id] : rules_)
      if (!builder_.defined(id)) throw std::invalid_argument("grammar: rule '" + name + "' is used but not defined");
    return std::move(builder_).build(root->second);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    std::size_t line = 1;
    for (std::size_t i = 0; i < at_ && i < text_.size(); ++i) line += text_[i] == '\n';
    throw std::invalid_argument("grammar line " + std::to_string(line) + ": " + what);
  }
  bool done() const { return at_ >= text_.size(); }
  bool peek(char c) const { return !done() && text_[at_] == c; }

  void skip_space() {
    while (!done()) {
      if (text_[at_] == '#') {
        while (!done() && text_[at_] != '\n') ++at_;
      } else if (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r') {
        ++at_;
      } else {
        return;
      }
    }
  }

  std::string rule_name() {
    const std::size_t start = at_;
    while (!done() && is_name_char(text_[at_])) ++at_;
    if (at_ == start) fail("expected a rule name");
    return std::string(text_.substr(start, at_ - start));
  }

  std::uint32_t rule_id(const std::string& name) {
    auto [it, inserted] = rules_.try_emplace(name, 0);
    if (inserted) it->second = builder_.add_rule(name);
    return it->second;
  }

  // Whether a rule definition (`name ::=`) starts here: it ends the current one.
  bool at_definition() const {
    std::size_t i = at_;
    while (i < text_.size() && is_name_char(text_[i])) ++i;
    if (i == at_) return false;
    while (i < text_.size() && (text_[i] == ' ' || text_[i] == '\t' || text_[i] == '\n' || text_[i] == '\r')) ++i;
    return text_.substr(i, 3) == "::=";
  }

  Expr alternation() {
    std::vector<Expr> branches = {sequence()};
    while (peek('|')) {
      ++at_;
      branches.push_back(sequence());
    }
    return alt(std::move(branches));
  }

  Expr sequence() {
    Expr e = empty_expr();
    for (skip_space(); !done() && !peek('|') && !peek(')') && !at_definition(); skip_space())
      e.items.push_back(quantified(atom()));
    return e;
  }

  std::uint32_t number() {
    const std::size_t start = at_;
    std::uint64_t n = 0;
    while (!done() && text_[at_] >= '0' && text_[at_] <= '9') {
      n = n * 10 + static_cast<std::uint64_t>(text_[at_++] - '0');
      if (n > 100000) fail("repetition count over 100000");
    }
    if (at_ == start) fail("expected a number");
    return static_cast<std::uint32_t>(n);
  }

  Expr quantified(Expr e) {
    for (;;) {
      if (peek('*')) e = star(std::move(e)), ++at_;
      else if (peek('+')) e = repeat(std::move(e), 1, Expr::kUnbounded), ++at_;
      else if (peek('?')) e = optional(std::move(e)), ++at_;
      else if (peek('{')) {
        ++at_;
        skip_space();
        const std::uint32_t min = number();
        std::uint32_t max = min;
        skip_space();
        if (peek(',')) {
          ++at_;
          skip_space();
          max = peek('}') ? Expr::kUnbounded : number();
          skip_space();
        }
        if (!peek('}')) fail("expected '}'");
        ++at_;
        if (max < min) fail("repetition {min,max} with max < min");
        e = repeat(std::move(e), min, max);
      } else {
        return e;
      }
    }
  }

  Expr atom() {
    if (peek('"')) return string_literal();
    if (peek('[')) {
      const std::size_t close = class_end();
      Expr e = regex_expr(text_.substr(at_, close - at_), RegexAlphabet::Utf8);
      at_ = close;
      return e;
    }
    if (peek('.')) {
      ++at_;
      return utf8_expr(CharSet::range(0, kMaxCodePoint));
    }
    if (peek('(')) {
      ++at_;
      if (++depth_ > 256) fail("groups nested deeper than 256");
      Expr e = alternation();
      --depth_;
      skip_space();
      if (!peek(')')) fail("missing ')'");
      ++at_;
      return e;
    }
    if (!is_name_char(text_[at_])) fail("unexpected '" + std::string(1, text_[at_]) + "'");
    return rule_expr(rule_id(rule_name()));
  }

  // The offset after the ']' closing the class at at_.
  std::size_t class_end() const {
    std::size_t i = at_ + 1;
    if (i < text_.size() && text_[i] == '^') ++i;
    for (bool first = true; i < text_.size() && (text_[i] != ']' || first); ++i) {
      first = false;
      if (text_[i] == '\\') ++i;
    }
    if (i >= text_.size()) fail("missing ']'");
    return i + 1;
  }

  std::uint32_t hex(std::size_t digits) {
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < digits; ++k, ++at_) {
      if (done()) fail("truncated escape");
      const char h = text_[at_];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("bad hex digit in escape");
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    return v;
  }

  // The hex digits of a \u or \U escape: a Unicode scalar value (UTF-8 cannot write a
  // surrogate, and nothing is above U+10FFFF).
  std::uint32_t code_point(std::size_t digits) {
    const std::size_t escape_at = at_ - 2;
    const std::uint32_t cp = hex(digits);
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > kMaxCodePoint) {
      const std::size_t line_start = text_.rfind('\n', escape_at);
      const std::size_t column = escape_at - (line_start == std::string_view::npos ? 0 : line_start + 1) + 1;
      fail("escape '" + std::string(text_.substr(escape_at, digits + 2)) + "' at column " + std::to_string(column) +
           (cp > kMaxCodePoint ? " is above U+10FFFF" : " is a UTF-16 surrogate, not a character"));
    }
    return cp;
  }

  Expr string_literal() {
    ++at_;
    std::string bytes;
    while (!done() && !peek('"')) {
      if (!peek('\\')) {
        bytes += text_[at_++];
        continue;
      }
      ++at_;
      if (done()) fail("truncated escape");
      const char c = text_[at_++];
      switch (c) {
        case 'n': bytes += '\n'; break;
        case 't': bytes += '\t'; break;
        case 'r': bytes += '\r'; break;
        case '\\': case '"': case '[': case ']': bytes += c; break;
        case 'x': bytes += utf8_encode(hex(2)); break;
        case 'u': bytes += utf8_encode(code_point(4)); break;
        case 'U': bytes += utf8_encode(code_point(8)); break;
        default: fail("unknown escape '\\" + std::string(1, c) + "'");
      }
    }
    if (!peek('"')) fail("unterminated string");
    ++at_;
    return literal(bytes);
  }

  std::string_view text_;
  std::size_t at_ = 0;
  int depth_ = 0;  // open parentheses
  GrammarBuilder builder_;
  std::map<std::string, std::uint32_t> rules_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text) { return GbnfParser(text).parse(); }

}  // namespace flexh2o::grammar
