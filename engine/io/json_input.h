// Parsing JSON from files and flags the user gives (tokenizer.json, config.json, safetensors
// headers, JSONL lines, --decode input). Printing a JSON value (dump) and copying or comparing
// one recurse once per level of nesting, so every parse here first refuses input nested deeper
// than any real file is: a 100,000-deep array must be an error message, not a stack overflow.
// Errors quote a bounded prefix, never a whole value.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace flexh2o::engine {

// Real files nest a few levels (tokenizer.json's normalizer sequences: about 8).
constexpr int kMaxJsonDepth = 128;
// What an error message quotes of a value or of the parser's message.
constexpr std::size_t kJsonExcerptChars = 120;

// `text` cut to `max_chars`, with how much was left out.
inline std::string bounded_excerpt(std::string_view text, std::size_t max_chars = kJsonExcerptChars) {
  if (text.size() <= max_chars) return std::string(text);
  return std::string(text.substr(0, max_chars)) + "... (" + std::to_string(text.size()) + " bytes)";
}

// A value for an error message. Safe on any value parse_json returned (its depth is bounded).
template <class Json>
std::string json_excerpt(const Json& value) {
  if (value.is_array() && value.size() > kJsonExcerptChars) return "an array of " + std::to_string(value.size()) + " items";
  if (value.is_object() && value.size() > kJsonExcerptChars)
    return "an object of " + std::to_string(value.size()) + " fields";
  return bounded_excerpt(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// Throws std::runtime_error "`where`: ..." when `text` nests arrays or objects deeper than
// kMaxJsonDepth. A linear scan over the bytes (strings skipped), so it costs no stack.
inline void check_json_depth(std::string_view text, const std::string& where) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw std::runtime_error(where + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                                 " levels (at byte " + std::to_string(i) + "); no file this reads nests so deep");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// The JSON document in `text`; throws std::runtime_error "`where`: ..." when it is too deep or
// not valid JSON (the parser's message cut to a bounded length).
template <class Json = nlohmann::json>
Json parse_json(std::string_view text, const std::string& where) {
  check_json_depth(text, where);
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(where + ": not valid JSON: " + bounded_excerpt(e.what(), 2 * kJsonExcerptChars));
  }
}

}  // namespace flexh2o::engine
