// Text helpers with Python's semantics: strings are sequences of code points (lengths, indexes
// and slices count code points, not bytes), Python's whitespace, case mapping, float repr.
#pragma once
#include <string>
#include <string_view>

namespace flexh2o::engine::chat {

std::u32string to_code_points(std::string_view utf8);
std::string to_utf8(std::u32string_view cps);
// Whether the bytes are valid UTF-8 (what Python can decode).
bool valid_utf8(std::string_view s);

// str.isspace() of one code point.
bool py_isspace(char32_t c);
// Python's case mappings: Unicode's full mappings ('ß'.upper() is 'SS'), final sigma in lower().
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::u32string upper_full(char32_t c);
std::u32string title_full(char32_t c);
// Lowercase of cps[i], which depends on its neighbours for a capital sigma.
std::u32string lower_at(const std::u32string& cps, std::size_t i);
// Simple one-to-one mappings, for tests that compare characters.
char32_t py_upper(char32_t c);
char32_t py_lower(char32_t c);
bool is_cased(char32_t c);
bool py_isalnum(char32_t c);
bool py_isalpha(char32_t c);
bool py_isdigit(char32_t c);
bool py_isprintable(char32_t c);

// repr(float): the shortest text that reads back as the same double ("1.0", "1e-05", "inf").
std::string float_repr(double d);
// markupsafe's escape(): & < > " ' as HTML entities.
std::string html_escape(std::string_view s);
// repr(str): quoted and escaped as Python prints it.
std::string string_repr(std::string_view s);

}  // namespace flexh2o::engine::chat
