// Python's str methods (`text.strip()`, `text.split('x')`, ...), on code points as Python's.
#pragma once
#include <string>
#include <vector>

#include "engine/chat/text.h"
#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

// Whether Python's str has the attribute (a method this engine may or may not implement).
bool is_string_method(const std::string& name);
// The bound method; calling one Python has but this engine lacks is a TemplateError.
Value string_method(const Value& self, const std::string& name);

// Shared with the filters.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right, int line);
std::vector<std::string> py_split(const std::string& s, const Value& sep, std::int64_t maxsplit, int line);
// Throws TemplateError before making a string of more than kMaxTextBytes.
std::string py_replace(const std::string& s, const std::string& old, const std::string& with, std::int64_t count,
                       int line);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);

}  // namespace flexh2o::engine::chat
