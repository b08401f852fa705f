#include "engine/serving/prompts.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/serving/line_reader.h"
#include "engine/serving/linear_json.h"

namespace flexh2o::engine {

std::vector<PromptItem> read_prompts_jsonl(const std::string& path) {
  LineReader in(path, kMaxPromptLineBytes);
  std::vector<PromptItem> items;
  std::map<std::string, std::int64_t> line_of_id;  // --resume keys on ids: they must be unique
  std::string line;
  for (std::int64_t lineno = 1; in.next(line); ++lineno) {
    in.count_line();
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    // In key order: a schema's properties are written in the order it gives them. A key given
    // twice is an error, as in OpenAI batch lines; the token ids are read aside.
    serving::IdArray ids{.path = {"tokens"}};
    const auto j = serving::parse_linear_json(line, where, &ids);
    if (!j.is_object()) throw std::runtime_error(where + ": expected an object with \"id\" and \"prompt\" or \"tokens\"");
    PromptItem item;
    if (!j.contains("id") || !(j["id"].is_string() || j["id"].is_number_integer()))
      throw std::runtime_error(where + ": field 'id' is missing or not a string/integer");
    item.id_json = j["id"].dump();
    if (const auto [it, fresh] = line_of_id.emplace(item.id_json, lineno); !fresh)
      throw std::runtime_error(where + ": id " + item.id_json + " was already used on line " + std::to_string(it->second) +
                               "; ids must be unique (the output and --resume go by id)");
    for (const auto& [key, value] : j.items())
      if (key != "id" && key != "prompt" && key != "tokens" && key != "max_tokens" &&
          std::find(serving::kStructuredOutputFields.begin(), serving::kStructuredOutputFields.end(), key) ==
              serving::kStructuredOutputFields.end())
        throw std::runtime_error(where + ": unknown field '" + key.substr(0, 64) +
                                 "'; a line holds 'id', 'prompt' or 'tokens', and optionally 'max_tokens' and one of "
                                 "'response_format', 'guided_json', 'guided_regex', 'guided_choice', 'guided_grammar'");
    try {
      item.constraint = serving::read_structured_output(j, "");
    } catch (const serving::StructuredOutputError& e) {
      throw std::runtime_error(where + ": " + e.what());
    }
    if (j.contains("max_tokens")) {
      const auto& m = j["max_tokens"];
      if (!m.is_number_integer() || m.get<std::int64_t>() < 1 || m.get<std::int64_t>() > kMaxTokensPerLine)
        throw std::runtime_error(where + ": field 'max_tokens' must be an integer in [1, " +
                                 std::to_string(kMaxTokensPerLine) + "]");
      item.max_tokens = m.get<std::int64_t>();
    }
    if (j.contains("prompt") && j.contains("tokens"))
      throw std::runtime_error(where + ": has both 'prompt' and 'tokens'; give one (the text, or its token ids)");
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) throw std::runtime_error(where + ": field 'prompt' must be a string");
      item.text = j["prompt"].get<std::string>();
    } else if (j.contains("tokens")) {
      if (!j["tokens"].is_array()) throw std::runtime_error(where + ": field 'tokens' must be an array of integers");
      if (!j["tokens"].empty()) throw std::runtime_error(where + ": field 'tokens' must hold non-negative integers");
      item.tokens = std::move(ids.ids);
    } else {
      throw std::runtime_error(where + ": needs a field 'prompt' (text) or 'tokens' (ids)");
    }
    items.push_back(std::move(item));
  }
  return items;
}

std::vector<std::int32_t> encode_prompt(const Tokenizer& tok, std::string_view text, std::int32_t config_bos_id) {
  if (tok.decides_special_tokens()) return tok.encode(text, true);
  std::vector<std::int32_t> ids;
  if (config_bos_id >= 0) ids.push_back(config_bos_id);
  const auto encoded = tok.encode(text, false);
  ids.insert(ids.end(), encoded.begin(), encoded.end());
  return ids;
}

void tokenize_prompts(std::vector<PromptItem>& items, const Tokenizer* tok, std::int32_t config_bos_id,
                      const std::string& model_name, std::int64_t context) {
  const auto too_long = [&](const PromptItem& it, const std::string& length) {
    return std::invalid_argument("prompt " + it.id_json + " has " + length + " but the model '" + model_name + "' has " +
                                 std::to_string(context) + " positions; shorten the prompt");
  };
  for (auto& it : items) {
    if (it.text) {
      if (!tok)
        throw std::runtime_error("model '" + model_name + "' has no tokenizer; give prompts as \"tokens\" or pass --tokenizer");
      const auto bytes = static_cast<std::int64_t>(it.text->size());
      if (bytes > context * kMaxBytesPerToken)
        throw too_long(it, std::to_string(bytes) + " bytes of text (more than " + std::to_string(kMaxBytesPerToken) +
                               " bytes a token)");
      it.tokens = encode_prompt(*tok, *it.text, config_bos_id);
    }
    if (static_cast<std::int64_t>(it.tokens.size()) > context)
      throw too_long(it, std::to_string(it.tokens.size()) + " tokens");
  }
}

std::vector<std::vector<std::int32_t>> synthetic_prompts(std::int64_t count, std::int64_t len, std::int64_t vocab) {
  std::vector<std::vector<std::int32_t>> out(static_cast<std::size_t>(count));
  for (std::int64_t b = 0; b < count; ++b)
    for (std::int64_t t = 0; t < len; ++t)
      out[static_cast<std::size_t>(b)].push_back(static_cast<std::int32_t>((b * 131 + t * 17 + 3) % vocab));
  return out;
}

}  // namespace flexh2o::engine
