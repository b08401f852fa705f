#include "engine/grammar/regex.h"

#include <cstdio>
#include <stdexcept>
#include <string>

namespace flexh2o::grammar {

namespace {

const char* json_escape(std::uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return nullptr;
  }
}

CharSet digit_set() { return CharSet::range('0', '9'); }
CharSet word_set() {
  CharSet s = CharSet::range('0', '9');
  s.add('A', 'Z');
  s.add('a', 'z');
  s.add('_', '_');
  return s;
}
CharSet space_set() {
  CharSet s = CharSet::range('\t', '\r');
  s.add(' ', ' ');
  return s;
}

class RegexParser {
 public:
  RegexParser(std::string_view pattern, RegexAlphabet alphabet) : text_(pattern), alphabet_(alphabet) {}

  Expr parse(bool search) {
    const bool anchored_start = peek('^');
    if (anchored_start) ++at_;
    Expr e = alternation();
    if (at_ < text_.size()) fail("unbalanced ')'");
    if (!search) return e;
    if ((anchored_start || anchored_end_) && e.kind == Expr::Kind::Alt) fail("an anchor with a top-level '|'");
    Expr any = star(char_expr(CharSet::range(0, kMaxCodePoint), alphabet_));
    Expr padded = empty_expr();
    if (!anchored_start) padded.items.push_back(any);
    padded.items.push_back(std::move(e));
    if (!anchored_end_) padded.items.push_back(std::move(any));
    return padded;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("regex: " + what + " at offset " + std::to_string(at_) + " of '" +
                                std::string(text_) + "'");
  }
  bool peek(char c) const { return at_ < text_.size() && text_[at_] == c; }
  bool done() const { return at_ >= text_.size(); }

  Expr alternation() {
    std::vector<Expr> branches = {concatenation()};
    while (peek('|')) {
      ++at_;
      branches.push_back(concatenation());
    }
    return alt(std::move(branches));
  }

  Expr concatenation() {
    Expr e = empty_expr();
    while (!done() && !peek('|') && !peek(')')) {
      if (peek('$')) {
        ++at_;
        if (depth_ > 0 || !done()) fail("'$' before the end");
        anchored_end_ = true;
        break;
      }
      if (peek('^')) fail("'^' after the start");
      e.items.push_back(quantified(atom()));
    }
    return e;
  }

  std::uint32_t number() {
    if (done() || text_[at_] < '0' || text_[at_] > '9') fail("expected a number in {}");
    std::uint64_t n = 0;
    while (!done() && text_[at_] >= '0' && text_[at_] <= '9') {
      n = n * 10 + static_cast<std::uint64_t>(text_[at_++] - '0');
      if (n > 100000) fail("repetition count over 100000");
    }
    return static_cast<std::uint32_t>(n);
  }

  Expr quantified(Expr e) {
    for (;;) {
      std::uint32_t min = 0, max = 0;
      if (peek('*')) min = 0, max = Expr::kUnbounded, ++at_;
      else if (peek('+')) min = 1, max = Expr::kUnbounded, ++at_;
      else if (peek('?')) min = 0, max = 1, ++at_;
      else if (peek('{') && at_ + 1 < text_.size() && text_[at_ + 1] >= '0' && text_[at_ + 1] <= '9') {
        ++at_;
        min = max = number();
        if (peek(',')) {
          ++at_;
          max = peek('}') ? Expr::kUnbounded : number();
        }
        if (!peek('}')) fail("expected '}'");
        ++at_;
        if (max < min) fail("repetition {min,max} with max < min");
      } else {
        return e;
      }
      if (peek('?')) ++at_;  // lazy: the same language
      else if (peek('+')) fail("possessive quantifier");
      e = repeat(std::move(e), min, max);
    }
  }

  Expr atom() {
    const char c = text_[at_];
    if (c == '(') return group();
    if (c == '[') return char_expr(bracket(), alphabet_);
    if (c == '.') {
      ++at_;
      CharSet any = CharSet::range(0, kMaxCodePoint);
      return char_expr(any.minus(CharSet::range('\n', '\n')), alphabet_);
    }
    if (c == '\\') return escape_atom();
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    return char_expr(single_char(), alphabet_);
  }

  Expr group() {
    ++at_;
    if (peek('?')) {
      ++at_;
      if (peek(':')) ++at_;
      else if (peek('P') && at_ + 1 < text_.size() && text_[at_ + 1] == '<') skip_name(at_ + 2);
      else if (peek('<') && at_ + 1 < text_.size() && text_[at_ + 1] != '=' && text_[at_ + 1] != '!') skip_name(at_ + 1);
      else fail("lookaround or inline flags '(?'");
    }
    if (++depth_ > 256) fail("groups nested deeper than 256");
    Expr e = alternation();
    --depth_;
    if (!peek(')')) fail("missing ')'");
    ++at_;
    return e;
  }

  void skip_name(std::size_t from) {
    const std::size_t close = text_.find('>', from);
    if (close == std::string_view::npos) fail("unterminated group name");
    at_ = close + 1;
  }

  // A code point of the pattern (UTF-8), stored as [value, value].
  std::uint32_t literal_char() {
    const auto b = static_cast<std::uint8_t>(text_[at_]);
    std::size_t length = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    if (at_ + length > text_.size()) fail("truncated UTF-8");
    std::uint32_t cp = length == 1 ? b : b & (0x3F >> (length - 1));
    for (std::size_t k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<std::uint8_t>(text_[at_ + k]) & 0x3F);
    at_ += length;
    return cp;
  }
  CharSet single_char() {
    const std::uint32_t cp = literal_char();
    return CharSet::range(cp, cp);
  }

  std::uint32_t hex(std::size_t digits) {
    if (at_ + digits > text_.size()) fail("truncated hex escape");
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < digits; ++k) {
      const char h = text_[at_++];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("bad hex digit");
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    return v;
  }

  // After a backslash: a class (\d, \w, \s and negations) or one code point.
  CharSet escape() {
    ++at_;
    if (done()) fail("trailing backslash");
    const char c = text_[at_++];
    switch (c) {
      case 'd': return digit_set();
      case 'D': return digit_set().complement();
      case 'w': return word_set();
      case 'W': return word_set().complement();
      case 's': return space_set();
      case 'S': return space_set().complement();
      case 'n': return CharSet::range('\n', '\n');
      case 't': return CharSet::range('\t', '\t');
      case 'r': return CharSet::range('\r', '\r');
      case 'f': return CharSet::range('\f', '\f');
      case 'v': return CharSet::range('\v', '\v');
      case '0': return CharSet::range(0, 0);
      case 'x': { const std::uint32_t v = hex(2); return CharSet::range(v, v); }
      case 'u': { const std::uint32_t v = hex(4); return CharSet::range(v, v); }
      case 'b': case 'B': fail("word boundary '\\" + std::string(1, c) + "'");
      case 'A': case 'Z': case 'z': case 'G': fail("anchor '\\" + std::string(1, c) + "'");
      default:
        if (c >= '1' && c <= '9') fail("backreference");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail("escape '\\" + std::string(1, c) + "'");
        --at_;
        const std::uint32_t cp = literal_char();
        return CharSet::range(cp, cp);
    }
  }

  Expr escape_atom() { return char_expr(escape(), alphabet_); }

  CharSet bracket() {
    ++at_;
    const bool negated = peek('^');
    if (negated) ++at_;
    CharSet set;
    bool first = true;
    while (!done() && (!peek(']') || first)) {
      first = false;
      CharSet lo_set = peek('\\') ? escape() : single_char();
      if (peek('-') && at_ + 1 < text_.size() && text_[at_ + 1] != ']') {
        ++at_;
        CharSet hi_set = peek('\\') ? escape() : single_char();
        if (lo_set.ranges().size() != 1 || hi_set.ranges().size() != 1 || lo_set.ranges()[0].first != lo_set.ranges()[0].second ||
            hi_set.ranges()[0].first != hi_set.ranges()[0].second)
          fail("a class escape as a range bound");
        if (hi_set.ranges()[0].first < lo_set.ranges()[0].first) fail("range out of order");
        set.add(lo_set.ranges()[0].first, hi_set.ranges()[0].first);
      } else {
        set.add(lo_set);
      }
    }
    if (!peek(']')) fail("missing ']'");
    ++at_;
    return negated ? set.complement() : set;
  }

  std::string_view text_;
  RegexAlphabet alphabet_;
  std::size_t at_ = 0;
  int depth_ = 0;
  bool anchored_end_ = false;
};

}  // namespace

Expr char_expr(const CharSet& set, RegexAlphabet alphabet) {
  if (alphabet == RegexAlphabet::Utf8) return utf8_expr(set);
  // Inside a JSON string: '"', '\' and the controls only as escapes, the rest as itself.
  CharSet escaped = CharSet::range(0, 0x1F);
  escaped.add('"', '"');
  escaped.add('\\', '\\');
  std::vector<Expr> options;
  const CharSet raw = set.minus(escaped);
  if (!raw.empty()) options.push_back(utf8_expr(raw));
  const CharSet needs_escape = set.intersect(escaped);
  for (auto [lo, hi] : needs_escape.ranges()) {
    for (std::uint32_t cp = lo; cp <= hi; ++cp) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\u%04x", cp);
      options.push_back(literal(json_escape(cp) ? json_escape(cp) : hex));
    }
  }
  return alt(std::move(options));
}

Expr regex_expr(std::string_view pattern, RegexAlphabet alphabet, bool search) {
  return RegexParser(pattern, alphabet).parse(search);
}

}  // namespace flexh2o::grammar
