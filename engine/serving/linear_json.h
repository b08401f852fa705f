// Parsing a request line into nlohmann::ordered_json in time linear in its length.
// ordered_json keeps an object's keys in order in a vector and nlohmann's own parser inserts
// each key with a scan of the keys before it, so an object of n keys costs n^2/2 string
// comparisons: a logit_bias of 200,000 entries took about 100 s. This parser builds the same
// value and finds a repeated key through a hash set per open object instead. A key repeated in
// one object is an error (nlohmann keeps the last value; a request that says a field twice is
// ambiguous), as is input nested deeper than engine::kMaxJsonDepth.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace flexh2o::serving {

// The JSON value in `text`; throws std::runtime_error "`where`: ..." when it is not valid JSON,
// nests too deep, or repeats a key within one object (the parser's message cut short).
nlohmann::ordered_json parse_linear_json(std::string_view text, const std::string& where);

}  // namespace flexh2o::serving
