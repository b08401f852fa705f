#include "engine/chat/formatting.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/chat/methods.h"
#include "engine/chat/text.h"

namespace flexh2o::engine::chat {

namespace {

// [[fill]align][sign][z][#][0][width][grouping][.precision][type]
struct Spec {
  char32_t fill = U' ';
  bool fill_given = false;
  char align = 0;  // '<', '>', '^', '=' or 0: the type's default
  char sign = 0;   // '+', '-', ' ' or 0
  bool no_negative_zero = false;
  bool alternate = false;
  std::int64_t width = -1;
  char grouping = 0;  // ',' or '_'
  std::int64_t precision = -1;
  char type = 0;
};

bool is_align(char32_t c) { return c == U'<' || c == U'>' || c == U'^' || c == U'='; }

std::int64_t read_number(const std::u32string& s, std::size_t& i, int line) {
  std::int64_t n = -1;
  while (i < s.size() && s[i] >= U'0' && s[i] <= U'9') {
    n = (n < 0 ? 0 : n) * 10 + (s[i] - U'0');
    if (n > 1'000'000) throw TemplateError("Too many decimal digits in format string", line);
    ++i;
  }
  return n;
}

// `default_align` is '<' for strings and '>' for numbers, as in CPython (it decides what a
// leading 0 means).
Spec parse_spec(const std::string& text, char default_align, const std::string& type_name, int line) {
  const std::u32string s = to_code_points(text);
  Spec spec;
  std::size_t i = 0;
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0];
    spec.fill_given = true;
    spec.align = static_cast<char>(s[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = static_cast<char>(s[0]);
    i = 1;
  }
  if (i < s.size() && (s[i] == U'+' || s[i] == U'-' || s[i] == U' ')) spec.sign = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == U'z') {
    spec.no_negative_zero = true;
    ++i;
  }
  if (i < s.size() && s[i] == U'#') {
    spec.alternate = true;
    ++i;
  }
  if (i < s.size() && s[i] == U'0' && !spec.fill_given) {
    spec.fill = U'0';
    if (!spec.align && default_align == '>') spec.align = '=';
    ++i;
  }
  spec.width = read_number(s, i, line);
  if (i < s.size() && (s[i] == U',' || s[i] == U'_')) spec.grouping = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == U'.') {
    ++i;
    spec.precision = read_number(s, i, line);
    if (spec.precision < 0) throw TemplateError("Format specifier missing precision", line);
  }
  if (s.size() - i > 1) {
    throw TemplateError("Invalid format specifier '" + text + "' for object of type '" + type_name + "'", line);
  }
  if (i < s.size()) spec.type = static_cast<char>(s[i] < 128 ? s[i] : '?');
  if (!spec.align) spec.align = default_align;
  return spec;
}

// Pads `prefix + body` to the width; '=' puts the fill between them (after a sign or 0x).
std::string pad(const std::string& prefix, const std::string& body, const Spec& spec) {
  const auto n = static_cast<std::int64_t>(to_code_points(prefix + body).size());
  if (spec.width <= n) return prefix + body;
  const std::int64_t total = spec.width - n;
  const std::int64_t left = spec.align == '<' ? 0 : spec.align == '^' ? total / 2 : total;
  const std::string fill = to_utf8(std::u32string(1, spec.fill));
  auto repeat = [&](std::int64_t k) {
    std::string out;
    for (std::int64_t j = 0; j < k; ++j) out += fill;
    return out;
  };
  if (spec.align == '=') return prefix + repeat(total) + body;
  return repeat(left) + prefix + body + repeat(total - left);
}

// Separators every `every` digits from the right of a run of digits.
std::string group(const std::string& digits, char sep, std::size_t every) {
  std::string out;
  for (std::size_t k = 0; k < digits.size(); ++k) {
    if (k > 0 && (digits.size() - k) % every == 0) out += sep;
    out += digits[k];
  }
  return out;
}

// Groups the integer digits; with zero padding, the padding is digits too and gets separators.
std::string grouped(std::string digits, const std::string& prefix, const std::string& rest, const Spec& spec,
                    std::size_t every) {
  if (!spec.grouping) return digits;
  std::string out = group(digits, spec.grouping, every);
  if (spec.align == '=' && spec.fill == U'0') {
    while (static_cast<std::int64_t>(prefix.size() + out.size() + to_code_points(rest).size()) < spec.width) {
      digits.insert(digits.begin(), '0');
      out = group(digits, spec.grouping, every);
    }
  }
  return out;
}

std::string format_str(const std::string& s, const Spec& spec, int line) {
  if (spec.type && spec.type != 's') {
    throw TemplateError(std::string("Unknown format code '") + spec.type + "' for object of type 'str'", line);
  }
  if (spec.sign) throw TemplateError("Sign not allowed in string format specifier", line);
  if (spec.alternate) throw TemplateError("Alternate form (#) not allowed in string format specifier", line);
  if (spec.align == '=') throw TemplateError("'=' alignment not allowed in string format specifier", line);
  if (spec.grouping) throw TemplateError(std::string("Cannot specify '") + spec.grouping + "' with 's'.", line);
  std::string body = s;
  if (spec.precision >= 0) {
    const std::u32string cps = to_code_points(s);
    if (static_cast<std::int64_t>(cps.size()) > spec.precision) {
      body = to_utf8(std::u32string_view(cps).substr(0, static_cast<std::size_t>(spec.precision)));
    }
  }
  return pad("", body, spec);
}

std::string sign_of(bool negative, const Spec& spec) {
  if (negative) return "-";
  return spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "";
}

std::string format_float(double d, const Spec& spec, int line);

std::string format_int(std::int64_t n, const Spec& spec, int line) {
  const char t = spec.type;
  if (t == 'e' || t == 'E' || t == 'f' || t == 'F' || t == 'g' || t == 'G' || t == '%') {
    return format_float(static_cast<double>(n), spec, line);
  }
  if (spec.precision >= 0) throw TemplateError("Precision not allowed in integer format specifier", line);
  if (t == 'c') {
    if (n < 0 || n > 0x10FFFF) throw TemplateError("%c arg not in range(0x110000)", line);
    return pad("", to_utf8(std::u32string(1, static_cast<char32_t>(n))), spec);
  }
  int base = 10;
  if (t == 'b') base = 2;
  else if (t == 'o') base = 8;
  else if (t == 'x' || t == 'X') base = 16;
  else if (t && t != 'd' && t != 'n') {
    throw TemplateError(std::string("Unknown format code '") + t + "' for object of type 'int'", line);
  }
  if (spec.grouping == ',' && base != 10) throw TemplateError(std::string("Cannot specify ',' with '") + t + "'.", line);
  std::uint64_t magnitude = n < 0 ? 0 - static_cast<std::uint64_t>(n) : static_cast<std::uint64_t>(n);
  std::string digits;
  do {
    digits.insert(digits.begin(), "0123456789abcdef"[magnitude % static_cast<std::uint64_t>(base)]);
    magnitude /= static_cast<std::uint64_t>(base);
  } while (magnitude);
  if (t == 'X') digits = upper(digits);
  std::string prefix = sign_of(n < 0, spec);
  if (spec.alternate && base != 10) prefix += t == 'b' ? "0b" : t == 'o' ? "0o" : t == 'x' ? "0x" : "0X";
  return pad(prefix, grouped(digits, prefix, "", spec, base == 10 ? 3 : 4), spec);
}

std::string printf_float(double magnitude, char type, std::int64_t precision, bool alternate) {
  const std::string fmt = std::string("%") + (alternate ? "#" : "") + ".*" + type;
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt.c_str(), static_cast<int>(precision), magnitude);
  return buf;
}

// A float with a precision and no type: like 'g', but exponent notation from 10^(p-1) on and a
// fixed-point result keeps a ".0" (CPython's repr mode with Py_DTSF_ADD_DOT_0).
std::string repr_with_precision(double magnitude, std::int64_t p, bool alternate) {
  const std::string sci = printf_float(magnitude, 'e', p - 1, alternate);
  const int exponent = std::atoi(sci.c_str() + sci.find('e') + 1);
  std::string body = exponent < -4 || exponent >= p - 1 ? sci : printf_float(magnitude, 'f', p - 1 - exponent, alternate);
  if (!alternate) {  // 'g' drops trailing zeros of the digits, and a bare point
    const std::size_t e = std::min(body.find('e'), body.size());
    std::string digits = body.substr(0, e);
    if (digits.find('.') != std::string::npos) {
      digits.erase(digits.find_last_not_of('0') + 1);
      if (digits.back() == '.') digits.pop_back();
    }
    body = digits + body.substr(e);
  }
  if (body.find_first_of(".e") == std::string::npos) body += ".0";
  return body;
}

std::string format_float(double d, const Spec& spec, int line) {
  char t = spec.type;
  if (t && std::string("eEfFgGn%").find(t) == std::string::npos) {
    throw TemplateError(std::string("Unknown format code '") + t + "' for object of type 'float'", line);
  }
  if (spec.precision > 300) throw TemplateError("precision too big", line);
  bool negative = std::signbit(d) && !std::isnan(d);
  double magnitude = std::fabs(d);
  std::string body;
  if (!t && spec.precision < 0) {
    body = float_repr(magnitude);
    const std::size_t e = body.find('e');
    if (spec.alternate && e != std::string::npos && body.find('.') == std::string::npos) body.insert(e, ".");
  } else if (!t && std::isfinite(magnitude)) {
    body = repr_with_precision(magnitude, std::max<std::int64_t>(spec.precision, 1), spec.alternate);
  } else if (std::isinf(magnitude) || std::isnan(magnitude)) {
    body = std::isinf(magnitude) ? "inf" : "nan";
    if (t == 'E' || t == 'F' || t == 'G') body = upper(body);
    if (t == '%') body += "%";
  } else {
    std::int64_t precision = spec.precision < 0 ? 6 : spec.precision;
    const char c = t == 'n' ? 'g' : t == '%' ? 'f' : t;
    if (c == 'g' || c == 'G') precision = std::max<std::int64_t>(precision, 1);
    body = printf_float(t == '%' ? magnitude * 100 : magnitude, c, precision, spec.alternate);
    if (t == '%') body += "%";
  }
  if (negative && spec.no_negative_zero && body.find_first_not_of("0.%e+-") == std::string::npos) negative = false;
  const std::string prefix = sign_of(negative, spec);
  const std::size_t int_end = std::min(body.find_first_not_of("0123456789"), body.size());
  const std::string rest = body.substr(int_end);
  return pad(prefix, grouped(body.substr(0, int_end), prefix, rest, spec, 3) + rest, spec);
}

// Python's ascii(): repr with every non-ASCII code point escaped.
std::string ascii_repr(const Value& v, int line) {
  std::string out;
  for (char32_t c : to_code_points(to_repr(v, line))) {
    if (c < 0x80) {
      out += static_cast<char>(c);
      continue;
    }
    char buf[16];
    const char* escape = c <= 0xFF ? "\\x%02x" : c <= 0xFFFF ? "\\u%04x" : "\\U%08x";
    std::snprintf(buf, sizeof buf, escape, static_cast<unsigned>(c));
    out += buf;
  }
  return out;
}

}  // namespace

std::string format_value(const Value& v, const std::string& spec_text, int line) {
  if (spec_text.empty()) return to_str(v, line);
  if (v.is_string()) return format_str(v.as_string(), parse_spec(spec_text, '<', "str", line), line);
  if (is_integral(v)) return format_int(to_int64(v), parse_spec(spec_text, '>', type_name(v), line), line);
  if (v.is_float()) return format_float(v.as_float(), parse_spec(spec_text, '>', "float", line), line);
  throw TemplateError("unsupported format string passed to " + type_name(v) + ".__format__", line);
}

namespace {

// What string.Formatter does with one replacement field: `name` is the field name (with .attr
// and [key] parts), `conversion` is 0, 's', 'r' or 'a', `spec` is already expanded.
class BraceFormatter {
 public:
  BraceFormatter(const std::vector<Value>& args, const Value& kwargs, bool escape, int line)
      : args_(args), kwargs_(kwargs), escape_(escape), line_(line) {}

  std::string format(const std::string& fmt, int depth) {
    if (depth < 0) throw TemplateError("Max string recursion exceeded", line_);
    std::string out;
    std::size_t i = 0;
    while (i < fmt.size()) {
      const char c = fmt[i];
      if (c == '}') {
        if (i + 1 >= fmt.size() || fmt[i + 1] != '}') {
          throw TemplateError("Single '}' encountered in format string", line_);
        }
        out += '}';
        i += 2;
      } else if (c == '{') {
        if (i + 1 == fmt.size()) throw TemplateError("Single '{' encountered in format string", line_);
        if (fmt[i + 1] == '{') {
          out += '{';
          i += 2;
          continue;
        }
        out += replacement(fmt, i, depth);
      } else {
        out += c;
        ++i;
      }
    }
    return out;
  }

 private:
  // Formats the field that starts at fmt[i] == '{' and leaves i past its '}'.
  std::string replacement(const std::string& fmt, std::size_t& i, int depth) {
    std::size_t j = i + 1;
    int nested = 1;
    bool in_brackets = false;
    std::size_t name_end = std::string::npos;
    for (; j < fmt.size(); ++j) {
      const char c = fmt[j];
      if (name_end == std::string::npos) {
        if (c == '[') in_brackets = true;
        if (c == ']') in_brackets = false;
        if (in_brackets) continue;
        if (c == '!' || c == ':') name_end = j;
      }
      if (c == '{') ++nested;
      if (c == '}' && --nested == 0) break;
    }
    if (j >= fmt.size()) throw TemplateError("expected '}' before end of string", line_);
    const std::string field = fmt.substr(i + 1, j - i - 1);
    const std::size_t split = name_end == std::string::npos ? field.size() : name_end - (i + 1);
    i = j + 1;
    const std::string name = field.substr(0, split);
    char conversion = 0;
    std::string spec;
    std::size_t k = split;
    if (k < field.size() && field[k] == '!') {
      if (k + 1 >= field.size()) throw TemplateError("end of string while looking for conversion specifier", line_);
      conversion = field[k + 1];
      k += 2;
      if (k < field.size() && field[k] != ':') throw TemplateError("expected ':' after conversion specifier", line_);
    }
    if (k < field.size()) spec = format(field.substr(k + 1), depth - 1);
    Value v = lookup_field(name);
    if (conversion == 's') v = to_str(v, line_);
    else if (conversion == 'r') v = to_repr(v, line_);
    else if (conversion == 'a') v = ascii_repr(v, line_);
    else if (conversion) throw TemplateError(std::string("Unknown conversion specifier ") + conversion, line_);
    if (escape_ && v.is_markup()) {
      if (!spec.empty()) throw TemplateError("Unsupported format specification for Markup.", line_);
      return v.as_string();
    }
    return escape_ ? html_escape(format_value(v, spec, line_)) : format_value(v, spec, line_);
  }

  Value lookup_field(std::string name) {
    count_field(name);
    std::size_t end = name.find_first_of(".[");
    if (end == std::string::npos) end = name.size();
    Value v = argument(name.substr(0, end));
    std::size_t i = end;
    while (i < name.size()) {
      if (name[i] == '.') {
        const std::size_t next = std::min(name.find_first_of(".[", i + 1), name.size());
        if (next == i + 1) throw TemplateError("Empty attribute in format string", line_);
        v = get_attribute(v, name.substr(i + 1, next - i - 1), line_);
        i = next;
      } else if (name[i] == '[') {
        const std::size_t close = name.find(']', i);
        if (close == std::string::npos) throw TemplateError("Missing ']' in format string", line_);
        const std::string key = name.substr(i + 1, close - i - 1);
        if (key.empty()) throw TemplateError("Empty attribute in format string", line_);
        v = get_item(v, all_digits(key) ? Value(static_cast<std::int64_t>(std::stoll(key))) : Value(key), line_);
        i = close + 1;
      } else {
        throw TemplateError("Only '.' or '[' may follow ']' in format field specifier", line_);
      }
    }
    return v;
  }

  static bool all_digits(const std::string& s) {
    return !s.empty() && s.size() < 18 && s.find_first_not_of("0123456789") == std::string::npos;
  }

  // string.Formatter numbers "{}" fields itself and refuses to mix them with "{0}" (its message
  // is the same both ways); "{0[x]}" and "{name}" do not count.
  void count_field(std::string& name) {
    if (name.empty()) {
      if (manual_) throw TemplateError("cannot switch from manual field specification to automatic field numbering", line_);
      name = std::to_string(next_auto_++);
    } else if (all_digits(name)) {
      if (next_auto_ > 0) throw TemplateError("cannot switch from manual field specification to automatic field numbering", line_);
      manual_ = true;
    }
  }

  Value argument(const std::string& first) {
    if (all_digits(first)) {
      const std::size_t index = std::stoul(first);
      if (index >= args_.size()) throw TemplateError("tuple index out of range", line_);
      return args_[index];
    }
    const Value* v = kwargs_.as_dict().find(Value(first));
    if (!v) throw TemplateError(string_repr(first), line_);
    return *v;
  }

  const std::vector<Value>& args_;
  const Value& kwargs_;
  bool escape_;
  int line_;
  bool manual_ = false;
  std::size_t next_auto_ = 0;
};

}  // namespace

std::string format_braces(const std::string& fmt, const std::vector<Value>& args, const Value& kwargs, bool escape,
                          int line) {
  return BraceFormatter(args, kwargs, escape, line).format(fmt, 2);
}

namespace {

// One printf conversion: %[(key)][flags][width][.precision][length]type
class PercentFormatter {
 public:
  PercentFormatter(const std::string& fmt, const Value& args, bool escape, int line)
      : fmt_(fmt), escape_(escape), line_(line) {
    if (args.is_tuple()) {
      args_ = args.as_list().items;
    } else {
      args_ = {args};
      if (args.is_dict() || args.is_list()) mapping_ = &args;
    }
  }

  std::string run() {
    std::string out;
    while (i_ < fmt_.size()) {
      const std::size_t pct = fmt_.find('%', i_);
      out += fmt_.substr(i_, pct == std::string::npos ? std::string::npos : pct - i_);
      if (pct == std::string::npos) break;
      i_ = pct + 1;
      out += conversion();
    }
    if (next_ < args_.size() && !mapping_) {
      throw TemplateError("not all arguments converted during string formatting", line_);
    }
    return out;
  }

 private:
  char peek() {
    if (i_ >= fmt_.size()) throw TemplateError("incomplete format", line_);
    return fmt_[i_];
  }

  Value next_arg() {
    if (keyed_) return keyed_value_;
    if (next_ >= args_.size()) throw TemplateError("not enough arguments for format string", line_);
    return args_[next_++];
  }

  std::int64_t star_or_number() {
    if (peek() == '*') {
      ++i_;
      const Value v = next_arg();
      if (!is_integral(v)) throw TemplateError("* wants int", line_);
      return to_int64(v);
    }
    std::int64_t n = -1;
    while (i_ < fmt_.size() && fmt_[i_] >= '0' && fmt_[i_] <= '9') n = (n < 0 ? 0 : n) * 10 + (fmt_[i_++] - '0');
    return n;
  }

  std::string conversion() {
    keyed_ = false;
    if (peek() == '(') read_key();
    Spec spec;
    spec.align = '>';
    bool zero = false;
    for (char c = peek(); c == '-' || c == '+' || c == ' ' || c == '#' || c == '0'; c = peek()) {
      if (c == '-') spec.align = '<';
      if (c == '+' || (c == ' ' && spec.sign != '+')) spec.sign = c;
      if (c == '#') spec.alternate = true;
      if (c == '0') zero = true;
      ++i_;
    }
    spec.width = star_or_number();
    if (spec.width < -1) {
      spec.align = '<';
      spec.width = -spec.width;
    }
    check_text_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(spec.width, 0)), line_);
    if (peek() == '.') {
      ++i_;
      spec.precision = std::max<std::int64_t>(0, star_or_number());
    }
    while (peek() == 'h' || peek() == 'l' || peek() == 'L') ++i_;
    const char type = fmt_[i_++];
    if (type == '%') return "%";
    if (zero && spec.align != '<' && std::string("srac").find(type) == std::string::npos) {
      spec.fill = U'0';
      spec.align = '=';
    }
    return convert(type, next_arg(), spec);
  }

  void read_key() {
    if (!mapping_) throw TemplateError("format requires a mapping", line_);
    int depth = 1;
    const std::size_t begin = ++i_;
    while (depth > 0) {
      const char c = peek();
      depth += c == '(' ? 1 : c == ')' ? -1 : 0;
      ++i_;
    }
    const Value key(fmt_.substr(begin, i_ - 1 - begin));
    if (mapping_->is_list()) throw TemplateError("list indices must be integers or slices, not str", line_);
    const Value* v = mapping_->as_dict().find(key);
    if (!v) throw TemplateError(to_repr(key, line_), line_);
    keyed_value_ = *v;
    keyed_ = true;
  }

  std::string convert(char type, const Value& v, Spec spec) {
    if (type == 's' || type == 'r' || type == 'a') {
      spec.sign = 0;  // printf ignores these flags for text
      spec.alternate = false;
      std::string text = type == 's' ? to_str(v, line_) : type == 'r' ? to_repr(v, line_) : ascii_repr(v, line_);
      if (escape_ && !(type == 's' && v.is_markup())) text = html_escape(text);
      return format_str(text, spec, line_);
    }
    if (type == 'c') return format_char(v, spec);
    if (std::string("diuoxX").find(type) != std::string::npos) return format_integer(type, v, spec);
    if (std::string("eEfFgG").find(type) != std::string::npos) {
      if (!v.is_number()) throw TemplateError("must be real number, not " + type_name(v), line_);
      spec.type = type;
      if (spec.precision < 0) spec.precision = 6;
      return format_float(to_double(v), spec, line_);
    }
    char buf[96];
    std::snprintf(buf, sizeof buf, "unsupported format character '%c' (0x%x) at index %zu", type,
                  static_cast<unsigned char>(type), i_ - 1);
    throw TemplateError(buf, line_);
  }

  std::string format_char(const Value& v, Spec spec) {
    spec.precision = -1;  // printf ignores a precision for %c
    if (v.is_string() && to_code_points(v.as_string()).size() == 1) return format_str(v.as_string(), spec, line_);
    if (!is_integral(v)) throw TemplateError("%c requires an int or a unicode character, not " + type_name(v), line_);
    spec.type = 'c';
    return format_int(to_int64(v), spec, line_);
  }

  std::string format_integer(char type, const Value& v, Spec spec) {
    const bool decimal = type == 'd' || type == 'i' || type == 'u';
    if (!is_integral(v) && !(decimal && v.is_float())) {
      throw TemplateError(std::string("%") + type + " format: " + (decimal ? "a real number" : "an integer") +
                              " is required, not " + type_name(v),
                          line_);
    }
    if (v.is_float() && !std::isfinite(v.as_float())) {
      throw TemplateError("cannot convert float infinity or NaN to integer", line_);
    }
    const std::int64_t n = v.is_float() ? static_cast<std::int64_t>(std::trunc(v.as_float())) : to_int64(v);
    spec.type = decimal ? 'd' : type;
    const std::int64_t precision = spec.precision;
    spec.precision = -1;
    Spec digits_only;
    digits_only.alternate = spec.alternate;
    digits_only.type = spec.type;
    std::string text = format_int(n, digits_only, line_);
    std::string sign = sign_of(n < 0, spec);
    if (n < 0) text.erase(0, 1);
    std::string prefix;
    if (spec.alternate && !decimal) {
      prefix = text.substr(0, 2);
      text.erase(0, 2);
    }
    if (precision > static_cast<std::int64_t>(text.size())) {
      text.insert(0, std::string(static_cast<std::size_t>(precision) - text.size(), '0'));
    }
    return pad(sign + prefix, text, spec);
  }

  const std::string& fmt_;
  bool escape_;
  int line_;
  std::vector<Value> args_;
  const Value* mapping_ = nullptr;
  std::size_t i_ = 0;
  std::size_t next_ = 0;
  bool keyed_ = false;
  Value keyed_value_;
};

}  // namespace

std::string format_percent(const std::string& fmt, const Value& args, bool escape, int line) {
  return PercentFormatter(fmt, args, escape, line).run();
}

}  // namespace flexh2o::engine::chat
