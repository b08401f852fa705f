// UTF-8 helpers shared by the tokenizer stages. Text may hold invalid UTF-8 (a prompt is
// bytes); the stages then treat each stray byte as a character of its own.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flexh2o::engine::tok {

inline bool is_continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Bytes of the character starting at `pos`: the byte plus up to three continuation bytes
// after it. On valid UTF-8 that is the character; it is also llama2.c run.c's grouping.
inline std::size_t char_length(std::string_view s, std::size_t pos) {
  std::size_t len = 1;
  while (len < 4 && pos + len < s.size() && is_continuation_byte(s[pos + len])) ++len;
  return len;
}

// The code point at `pos` and its length in bytes; an invalid sequence reads as one byte
// with code point U+FFFD.
struct CodePoint {
  char32_t value;
  std::size_t length;
};
CodePoint decode_code_point(std::string_view s, std::size_t pos);
// The code point that ends at `end` (exclusive), read backwards.
CodePoint decode_code_point_before(std::string_view s, std::size_t end);

void append_utf8(std::string& out, char32_t cp);

// Unicode White_Space, what `\s` matches in Rust's and Oniguruma's regexes.
bool is_white_space(char32_t cp);
// Rust regex's `\w` (what single_word added tokens look at): letters, letter numbers, marks,
// decimal digits, connector punctuation, joiners. By general category, so Alphabetic's few
// symbols (circled letters) are not word characters here.
bool is_word_char(char32_t cp);

}  // namespace flexh2o::engine::tok
