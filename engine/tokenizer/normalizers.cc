#include "engine/tokenizer/normalizers.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "engine/tokenizer/utf8.h"

namespace flexh2o::engine::tok {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// `run` (valid UTF-8) in the normal form `options` selects, appended to `out`.
void append_normalized(std::string_view run, int options, std::string& out) {
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                          static_cast<utf8proc_ssize_t>(run.size()), &result,
                                          static_cast<utf8proc_option_t>(options));
  const std::unique_ptr<utf8proc_uint8_t, FreeDeleter> owned(result);
  if (n < 0) throw std::runtime_error(std::string("Unicode normalization: ") + utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(result), static_cast<std::size_t>(n));
}

}  // namespace

void UnicodeNormalizer::normalize(std::string& text) const {
  // ASCII is in every normal form.
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return;
  int options = UTF8PROC_STABLE;
  switch (form_) {
    case Form::kNfc: options |= UTF8PROC_COMPOSE; break;
    case Form::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case Form::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case Form::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  // Normalize the runs of valid UTF-8 and keep the bytes between them.
  std::string out;
  out.reserve(text.size());
  std::size_t run_start = 0;
  for (std::size_t i = 0; i < text.size();) {
    const CodePoint cp = decode_code_point(text, i);
    if (cp.value == 0xFFFD && cp.length == 1) {  // not UTF-8
      append_normalized(std::string_view(text).substr(run_start, i - run_start), options, out);
      out.push_back(text[i]);
      run_start = i + 1;
    }
    i += cp.length;
  }
  append_normalized(std::string_view(text).substr(run_start), options, out);
  text = std::move(out);
}

void PrependNormalizer::normalize(std::string& text) const {
  if (!text.empty()) text = prefix_ + text;
}

std::string replace_all(const Regex& pattern, const std::string& text, const std::string& content) {
  std::string out;
  std::size_t last = 0;
  for (const auto& [start, end] : pattern.find_all(text)) {
    out.append(text, last, start - last);
    out += content;
    last = end;
  }
  out.append(text, last);
  return out;
}

void ReplaceNormalizer::normalize(std::string& text) const { text = replace_all(pattern_, text, content_); }

void SequenceNormalizer::normalize(std::string& text) const {
  for (const auto& stage : stages_) stage->normalize(text);
}

}  // namespace flexh2o::engine::tok
