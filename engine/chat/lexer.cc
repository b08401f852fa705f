#include "engine/chat/lexer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string_view>

#include "engine/chat/text.h"
#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

namespace {

// \r\n and \r become \n; one trailing newline goes (keep_trailing_newline is off).
std::string normalize_newlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string rstrip_whitespace(const std::string& s) {
  std::u32string cps = to_code_points(s);
  while (!cps.empty() && py_isspace(cps.back())) cps.pop_back();
  return to_utf8(cps);
}

bool is_space_byte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {
    for (std::size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const std::size_t open = find_tag_open(pos_);
      if (open == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        break;
      }
      const char kind = src_[open + 1];
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      std::string text = src_.substr(pos_, open - pos_);
      if (sign == '-') {
        text = rstrip_whitespace(text);
      } else if (sign != '+' && kind != '{') {
        lstrip_block(text, pos_);
      }
      emit_text(std::move(text), pos_);
      std::size_t body = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        pos_ = skip_comment(body, open);
      } else if (kind == '%' && raw_block_at(body)) {
        pos_ = read_raw(body, open);
      } else {
        pos_ = read_tag(kind, body, open);
      }
    }
    tokens_.push_back({TokenType::End, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  int line_at(std::size_t p) const {
    return static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), p) - newlines_.begin()) + 1;
  }

  [[noreturn]] void fail(const std::string& what, std::size_t p) const { throw TemplateError(what, line_at(p)); }

  std::size_t find_tag_open(std::size_t from) const {
    for (std::size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  void emit_text(std::string text, std::size_t at) {
    if (!text.empty()) tokens_.push_back({TokenType::Text, std::move(text), line_at(at)});
  }

  // lstrip_blocks: drop the spaces before a block tag when only whitespace precedes it on its line.
  void lstrip_block(std::string& text, std::size_t text_start) const {
    const std::size_t nl = text.rfind('\n');
    const std::size_t from = nl == std::string::npos ? 0 : nl + 1;
    const bool line_start = nl != std::string::npos || text_start == 0 || src_[text_start - 1] == '\n';
    if (!line_start) return;
    for (char32_t c : to_code_points(std::string_view(text).substr(from))) {
      if (!py_isspace(c)) return;
    }
    text.erase(from);
  }

  // After a tag's end: `-` eats all whitespace, plain (trim_blocks) one newline, `+` nothing.
  std::size_t after_block_end(std::size_t p, char sign) const {
    if (sign == '-') return skip_whitespace_all(p);
    if (sign == '+') return p;
    return (p < src_.size() && src_[p] == '\n') ? p + 1 : p;
  }

  std::size_t skip_whitespace_all(std::size_t p) const {
    while (p < src_.size()) {
      const std::u32string one = to_code_points(std::string_view(src_).substr(p, std::min<std::size_t>(4, src_.size() - p)));
      if (one.empty() || !py_isspace(one[0])) break;
      p += to_utf8(one.substr(0, 1)).size();
    }
    return p;
  }

  std::size_t skip_comment(std::size_t body, std::size_t open) const {
    const std::size_t close = src_.find("#}", body);
    if (close == std::string::npos) fail("missing end of comment tag", open);
    const char sign = close > body ? src_[close - 1] : '\0';
    return after_block_end(close + 2, sign == '-' || sign == '+' ? sign : '\0');
  }

  bool word_at(std::size_t& p, std::string_view word) const {
    std::size_t q = p;
    while (q < src_.size() && is_space_byte(src_[q])) ++q;
    if (src_.compare(q, word.size(), word) != 0) return false;
    q += word.size();
    if (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) return false;
    p = q;
    return true;
  }

  // Where a block end (`%}` with its sign) starts at p after spaces, or npos.
  std::size_t block_end_at(std::size_t p, char& sign) const {
    while (p < src_.size() && is_space_byte(src_[p])) ++p;
    sign = '\0';
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
    return src_.compare(p, 2, "%}") == 0 ? p + 2 : std::string::npos;
  }

  bool raw_block_at(std::size_t body) const {
    std::size_t p = body;
    char sign = '\0';
    return word_at(p, "raw") && block_end_at(p, sign) != std::string::npos;
  }

  std::size_t read_raw(std::size_t body, std::size_t open) {
    std::size_t p = body;
    word_at(p, "raw");
    char sign = '\0';
    std::size_t content = after_block_end(block_end_at(p, sign), sign);
    for (std::size_t q = src_.find("{%", content); q != std::string::npos; q = src_.find("{%", q + 2)) {
      std::size_t r = q + 2;
      const char end_sign = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r] : '\0';
      if (end_sign) ++r;
      char close_sign = '\0';
      if (!word_at(r, "endraw")) continue;
      const std::size_t close = block_end_at(r, close_sign);
      if (close == std::string::npos) continue;
      std::string text = src_.substr(content, q - content);
      if (end_sign == '-') text = rstrip_whitespace(text);
      else if (end_sign != '+') lstrip_block(text, content);
      emit_text(std::move(text), content);
      return after_block_end(close, close_sign);
    }
    fail("missing {% endraw %} for this {% raw %}", open);
  }

  std::size_t read_tag(char kind, std::size_t p, std::size_t open) {
    tokens_.push_back({kind == '{' ? TokenType::VariableBegin : TokenType::BlockBegin, "", line_at(open)});
    int depth = 0;
    while (true) {
      while (p < src_.size() && is_space_byte(src_[p])) ++p;
      if (p >= src_.size()) fail(kind == '{' ? "unclosed '{{' (no '}}')" : "unclosed '{%' (no '%}')", open);
      if (depth == 0) {
        if (const std::size_t after = tag_end_at(kind, p); after != std::string::npos) return after;
      }
      p = read_token(p, depth);
    }
  }

  // At a tag's end: pushes the end token and returns where text resumes; else npos.
  std::size_t tag_end_at(char kind, std::size_t p) {
    const std::string_view close = kind == '{' ? "}}" : "%}";
    const TokenType type = kind == '{' ? TokenType::VariableEnd : TokenType::BlockEnd;
    char sign = '\0';
    std::size_t q = p;
    if (src_[q] == '-' || (kind == '%' && src_[q] == '+')) sign = src_[q++];
    if (src_.compare(q, 2, close) != 0) return std::string::npos;
    tokens_.push_back({type, "", line_at(p)});
    if (kind == '{') return sign == '-' ? skip_whitespace_all(q + 2) : q + 2;
    return after_block_end(q + 2, sign);
  }

  std::size_t read_token(std::size_t p, int& depth) {
    const char c = src_[p];
    const int line = line_at(p);
    if (c == '\'' || c == '"') return read_string(p);
    if (std::isdigit(static_cast<unsigned char>(c))) return read_number(p);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t q = p;
      while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
      tokens_.push_back({TokenType::Name, src_.substr(p, q - p), line});
      return q;
    }
    static constexpr std::array<std::string_view, 6> kTwoChar = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwoChar) {
      if (src_.compare(p, 2, op) == 0) {
        tokens_.push_back({TokenType::Operator, std::string(op), line});
        return p + 2;
      }
    }
    if (!std::strchr("+-/*%~[](){},.:|=<>;", c)) fail(std::string("unexpected character '") + c + "' in a tag", p);
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') {
      if (--depth < 0) fail(std::string("unexpected '") + c + "'", p);
    }
    tokens_.push_back({TokenType::Operator, std::string(1, c), line});
    return p + 1;
  }

  std::size_t read_number(std::size_t p) {
    const int line = line_at(p);
    auto digits = [&](std::size_t q) {
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) ||
                                 (src_[q] == '_' && q + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q + 1]))))) {
        ++q;
      }
      return q;
    };
    std::size_t q = digits(p);
    bool is_float = false;
    const bool after_dot = !tokens_.empty() && tokens_.back().type == TokenType::Operator && tokens_.back().value == ".";
    if (!after_dot && q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      q = digits(q + 1);
      is_float = true;
    }
    if (!after_dot && q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      std::size_t e = q + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        q = digits(e);
        is_float = true;
      }
    }
    std::string text = src_.substr(p, q - p);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    tokens_.push_back({is_float ? TokenType::Float : TokenType::Integer, text, line});
    return q;
  }

  std::size_t read_string(std::size_t p) {
    const char quote = src_[p];
    const int line = line_at(p);
    std::string raw;
    std::size_t q = p + 1;
    while (q < src_.size() && src_[q] != quote) {
      if (src_[q] == '\\' && q + 1 < src_.size()) raw += src_[q++];
      raw += src_[q++];
    }
    if (q >= src_.size()) fail("unterminated string", p);
    tokens_.push_back({TokenType::String, unescape(raw, p), line});
    return q + 1;
  }

  // Python's string escapes (jinja2 decodes literals with "unicode-escape").
  std::string unescape(const std::string& raw, std::size_t at) const {
    std::string out;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '\\' || i + 1 >= raw.size()) {
        out += raw[i];
        continue;
      }
      const char e = raw[++i];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;  // line continuation
        case 'x': case 'u': case 'U': i = hex_escape(raw, i, e, out, at); break;
        default:
          if (e >= '0' && e <= '7') {
            unsigned v = 0;
            std::size_t n = 0;
            for (; n < 3 && i < raw.size() && raw[i] >= '0' && raw[i] <= '7'; ++n, ++i) v = v * 8 + static_cast<unsigned>(raw[i] - '0');
            --i;
            out += to_utf8(std::u32string(1, static_cast<char32_t>(v)));
          } else if (e == 'N') {
            fail("\\N{...} escapes in strings are not supported", at);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }

  std::size_t hex_escape(const std::string& raw, std::size_t i, char e, std::string& out, std::size_t at) const {
    const std::size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
    char32_t v = 0;
    for (std::size_t k = 1; k <= n; ++k) {
      const char h = i + k < raw.size() ? raw[i + k] : '\0';
      if (!std::isxdigit(static_cast<unsigned char>(h))) fail(std::string("truncated \\") + e + " escape in a string", at);
      v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) fail("escape outside Unicode scalar values in a string", at);
    out += to_utf8(std::u32string(1, v));
    return i + n;
  }

  std::string src_;
  std::vector<std::size_t> newlines_;
  std::size_t pos_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace flexh2o::engine::chat
