// Parsing a request line into nlohmann::ordered_json in time linear in its length.
// ordered_json keeps an object's keys in order in a vector and nlohmann's own parser inserts
// each key with a scan of the keys before it, so an object of n keys costs n^2/2 string
// comparisons: a logit_bias of 200,000 entries took about 100 s. This parser builds the same
// value and finds a repeated key through a hash set per open object instead. A key repeated in
// one object is an error (nlohmann keeps the last value; a request that says a field twice is
// ambiguous), as is input nested deeper than engine::kMaxJsonDepth.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace flexh2o::serving {

// An array of token ids at a fixed place in a line (a prompt's "tokens"), its items read
// straight into `ids` instead of as JSON values: a value takes 16 bytes and more, "7," of text
// two, so a line of ids would take ~20 times its size as a JSON value, 2 times as ids.
struct IdArray {
  std::vector<std::string> path;  // the keys from the root object to the array
  bool found = false;             // the array was there
  // Its items that are integers in [0, INT32_MAX]; the parsed value keeps the array with its
  // other items only (empty when all were ids).
  std::vector<std::int32_t> ids;
};

// The JSON value in `text`; throws std::runtime_error "`where`: ..." when it is not valid JSON,
// nests too deep, or repeats a key within one object (the parser's message cut short). With
// `ids`, the array at ids->path is read into it (above).
nlohmann::ordered_json parse_linear_json(std::string_view text, const std::string& where, IdArray* ids = nullptr);

// Whether the JSON object in `text` has `key` at its top level; none when `text` is not a JSON
// object. Parses without building the value (a line of many megabytes costs no memory).
std::optional<bool> object_has_key(std::string_view text, const std::string& key);

}  // namespace flexh2o::serving
