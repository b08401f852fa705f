#include "engine/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <new>
#include <stdexcept>

#include "engine/tokenizer/utf8.h"

namespace flexh2o::engine::tok {
namespace {

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  pcre2_get_error_message(code, buf.data(), buf.size());
  return reinterpret_cast<const char*>(buf.data());
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

Regex::Regex(std::string_view pattern, Syntax syntax) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // MATCH_INVALID_UTF: bytes that are not UTF-8 cannot match instead of failing the match.
  std::uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= syntax == Syntax::kLiteral ? PCRE2_LITERAL : PCRE2_UCP;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset,
                        nullptr);
  if (code_ == nullptr) {
    throw std::runtime_error("regex " + std::string(pattern) + ": " + pcre2_message(error) + " at offset " +
                             std::to_string(offset));
  }
  // The interpreter re-validates the rest of the subject on every call under MATCH_INVALID_UTF,
  // which makes long texts quadratic; JIT code checks UTF as it goes. Where JIT is unavailable
  // (the call fails) pcre2_match falls back to the interpreter, still correct.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(code_); }

Regex::Regex(Regex&& other) noexcept : pattern_(std::move(other.pattern_)), code_(other.code_) {
  other.code_ = nullptr;
}

Regex& Regex::operator=(Regex&& other) noexcept {
  std::swap(pattern_, other.pattern_);
  std::swap(code_, other.code_);
  return *this;
}

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(std::string_view subject) const {
  const std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(pcre2_match_data_create_from_pattern(code_, nullptr));
  if (!match) throw std::bad_alloc();
  std::vector<std::pair<std::size_t, std::size_t>> found;
  const auto text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  std::size_t pos = 0;
  bool have_last = false;
  std::size_t last_end = 0;
  while (pos <= subject.size()) {
    const int rc = pcre2_match(code_, text, subject.size(), pos, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error("regex " + pattern_ + ": " + pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const std::size_t start = ovector[0];
    const std::size_t end = ovector[1];
    if (start == end && have_last && last_end == end) {
      if (pos >= subject.size()) break;
      pos += char_length(subject, pos);
      continue;
    }
    found.emplace_back(start, end);
    have_last = true;
    last_end = end;
    pos = end;
  }
  return found;
}

}  // namespace flexh2o::engine::tok
