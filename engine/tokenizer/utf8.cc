#include "engine/tokenizer/utf8.h"

#include <utf8proc.h>

namespace flexh2o::engine::tok {

CodePoint decode_code_point(std::string_view s, std::size_t pos) {
  utf8proc_int32_t cp = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + pos),
                                  static_cast<utf8proc_ssize_t>(s.size() - pos), &cp);
  if (n <= 0) return {0xFFFD, 1};
  return {static_cast<char32_t>(cp), static_cast<std::size_t>(n)};
}

CodePoint decode_code_point_before(std::string_view s, std::size_t end) {
  std::size_t start = end - 1;
  while (start > 0 && end - start < 4 && is_continuation_byte(s[start])) --start;
  const CodePoint cp = decode_code_point(s, start);
  if (start + cp.length == end) return cp;
  return {0xFFFD, 1};
}

void append_utf8(std::string& out, char32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
}

bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_word_char(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace flexh2o::engine::tok
