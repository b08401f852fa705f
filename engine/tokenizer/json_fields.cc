#include "engine/tokenizer/json_fields.h"

#include <stdexcept>

#include "offload/text_file.h"

namespace flexh2o::engine::tok {

using nlohmann::json;

void fail(const std::string& path, const std::string& what) { throw std::runtime_error(path + ": " + what); }

json read_json(const std::string& path) {
  const auto text = offload::read_text_file(path, offload::kMaxTokenizerFileBytes);
  if (!text) fail(path, "cannot open");
  return parse_json(*text, path);
}

const json& field(const json& object, const char* name, const std::string& path, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end()) fail(path, "missing field " + where + name);
  return *it;
}

std::int32_t parse_id(const json& value, const std::string& path, const std::string& where) {
  if (!value.is_number_integer() || value.get<std::int64_t>() < 0 || value.get<std::int64_t>() >= kMaxVocabSize) {
    fail(path,
         where + ": expected a token id (integer in [0, " + std::to_string(kMaxVocabSize) + ")), got " + json_excerpt(value));
  }
  return value.get<std::int32_t>();
}

Vocab parse_vocab(const json& object, const std::string& path, const std::string& where) {
  if (!object.is_object()) fail(path, where + ": expected an object of token -> id");
  std::vector<std::pair<std::string, std::int32_t>> entries;
  entries.reserve(object.size());
  for (const auto& [token, id] : object.items()) {
    // The location string only when needed: vocabs have 10^5 entries.
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= kMaxVocabSize) {
      parse_id(id, path, where + "[\"" + token + "\"]");
    }
    entries.emplace_back(token, id.get<std::int32_t>());
  }
  try {
    return Vocab(std::move(entries));
  } catch (const std::runtime_error& e) {
    fail(path, where + ": " + e.what());
  }
}

std::optional<std::pair<std::string, std::string>> split_merge(std::string_view line) {
  const std::size_t space = line.find(' ');
  if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
      line.find(' ', space + 1) != std::string_view::npos) {
    return std::nullopt;
  }
  return std::pair{std::string(line.substr(0, space)), std::string(line.substr(space + 1))};
}

std::string bad_merge(std::string_view line) {
  return "expected \"a b\" (two tokens separated by one space), got \"" + std::string(line) + "\"";
}

}  // namespace flexh2o::engine::tok
