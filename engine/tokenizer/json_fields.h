// Reading tokenizer files that are JSON (tokenizer.json, vocab.json): errors name the file and
// the field.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/io/json_input.h"
#include "engine/tokenizer/vocab.h"

namespace flexh2o::engine::tok {

// Far above any real vocab (the largest are ~260k); keeps a corrupt id from allocating gigabytes.
constexpr std::int64_t kMaxVocabSize = std::int64_t{1} << 22;

[[noreturn]] void fail(const std::string& path, const std::string& what);
nlohmann::json read_json(const std::string& path);

// Throws naming `where + name` when the field is missing.
const nlohmann::json& field(const nlohmann::json& object, const char* name, const std::string& path,
                            const std::string& where);
std::int32_t parse_id(const nlohmann::json& value, const std::string& path, const std::string& where);
// An object of token -> id.
Vocab parse_vocab(const nlohmann::json& object, const std::string& path, const std::string& where);
// A merge written "a b": exactly one space between two non-empty tokens; nullopt otherwise.
std::optional<std::pair<std::string, std::string>> split_merge(std::string_view line);
// Why `line` is not a merge, for an error message.
std::string bad_merge(std::string_view line);

}  // namespace flexh2o::engine::tok
