#include "engine/chat/text.h"

#include <utf8proc.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace flexh2o::engine::chat {

namespace {

utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

}  // namespace

std::u32string to_code_points(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  std::size_t pos = 0;
  while (pos < s.size()) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + pos),
                                    static_cast<utf8proc_ssize_t>(s.size() - pos), &cp);
    if (n <= 0) {  // validated at the boundaries; a stray byte reads as U+FFFD
      out.push_back(0xFFFD);
      ++pos;
      continue;
    }
    out.push_back(static_cast<char32_t>(cp));
    pos += static_cast<std::size_t>(n);
  }
  return out;
}

std::string to_utf8(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) {
    utf8proc_uint8_t buf[4];
    const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
    out.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
  }
  return out;
}

bool valid_utf8(std::string_view s) {
  std::size_t pos = 0;
  while (pos < s.size()) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + pos),
                                    static_cast<utf8proc_ssize_t>(s.size() - pos), &cp);
    if (n <= 0) return false;
    pos += static_cast<std::size_t>(n);
  }
  return true;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

struct CaseException {
  char32_t code_point;
  const char32_t* mapped;
};
#include "engine/chat/case_table.inc"

template <std::size_t N>
const char32_t* find_exception(const CaseException (&table)[N], char32_t c) {
  for (const CaseException& e : table) {
    if (e.code_point == c) return e.mapped;
  }
  return nullptr;
}

bool is_case_ignorable(char32_t c) {
  switch (category(c)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      return c == '\'' || c == '.' || c == ':' || c == 0xB7 || c == 0x387 || c == 0x5F4 || c == 0x2018 ||
             c == 0x2019 || c == 0x2024 || c == 0x2027 || c == 0xFE13 || c == 0xFE52 || c == 0xFE55 ||
             c == 0xFF07 || c == 0xFF0E || c == 0xFF1A;
  }
}

// CPython's handle_capital_sigma: final sigma after a cased letter not followed by one.
char32_t lower_sigma(const std::u32string& cps, std::size_t i) {
  std::size_t j = i;
  while (j > 0 && is_case_ignorable(cps[j - 1])) --j;
  bool final_sigma = j > 0 && is_cased(cps[j - 1]);
  if (final_sigma) {
    std::size_t k = i + 1;
    while (k < cps.size() && is_case_ignorable(cps[k])) ++k;
    final_sigma = k == cps.size() || !is_cased(cps[k]);
  }
  return final_sigma ? 0x3C2 : 0x3C3;
}

}  // namespace

bool is_cased(char32_t c) {
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

char32_t py_upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t py_lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

std::u32string upper_full(char32_t c) {
  if (const char32_t* m = find_exception(kUpperExceptions, c)) return m;
  return std::u32string(1, py_upper(c));
}

std::u32string title_full(char32_t c) {
  if (const char32_t* m = find_exception(kTitleExceptions, c)) return m;
  return std::u32string(1, static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))));
}

std::u32string lower_at(const std::u32string& cps, std::size_t i) {
  if (cps[i] == 0x3A3) return std::u32string(1, lower_sigma(cps, i));
  if (const char32_t* m = find_exception(kLowerExceptions, cps[i])) return m;
  return std::u32string(1, py_lower(cps[i]));
}

std::string upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : to_code_points(s)) out += upper_full(c);
  return to_utf8(out);
}

std::string lower(std::string_view s) {
  const std::u32string cps = to_code_points(s);
  std::u32string out;
  for (std::size_t i = 0; i < cps.size(); ++i) out += lower_at(cps, i);
  return to_utf8(out);
}

bool py_isalpha(char32_t c) {
  const auto cat = category(c);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
bool py_isdigit(char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; }
bool py_isalnum(char32_t c) {
  const auto cat = category(c);
  return py_isalpha(c) || cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr does:
  // positional for 1e-4 <= |d| < 1e16, else d.ddde+XX.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const std::size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  if (digits.size() > 1) digits.erase(1, 1);  // the decimal point
  const int exponent = std::atoi(sci.c_str() + e_pos + 1);
  const int n = static_cast<int>(digits.size());
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= n - 1) return sign + digits + std::string(static_cast<std::size_t>(exponent - (n - 1)), '0') + ".0";
    if (exponent < 0) return sign + "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    return sign + digits.substr(0, static_cast<std::size_t>(exponent + 1)) + "." +
           digits.substr(static_cast<std::size_t>(exponent + 1));
  }
  std::string mantissa = digits.substr(0, 1);
  if (n > 1) mantissa += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return sign + mantissa + exp_buf;
}

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : to_code_points(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && !py_isprintable(c))) {
      char buf[16];
      if (c <= 0xFF) {
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      } else if (c <= 0xFFFF) {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      out += to_utf8(std::u32string(1, c));
    }
  }
  out += quote;
  return out;
}

}  // namespace flexh2o::engine::chat
