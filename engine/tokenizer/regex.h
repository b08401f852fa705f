// PCRE2 regexes for the Split pre-tokenizer and the Replace stages, matched the way Hugging
// Face tokenizers' Oniguruma regexes are: UTF-8 with Unicode classes (\p{L}, \s), lookahead,
// leftmost-first alternation. Known difference: PCRE2's \s also matches U+180E.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace flexh2o::engine::tok {

class Regex {
 public:
  enum class Syntax { kRegex, kLiteral };
  // Throws std::runtime_error with PCRE2's message and the offset in the pattern.
  Regex(std::string_view pattern, Syntax syntax);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // [start, end) of each match, left to right, without overlaps. An empty match right after
  // the previous match is skipped (as Rust's and the onig crate's find_iter do). Bytes that
  // are not UTF-8 never match.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view subject) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace flexh2o::engine::tok
