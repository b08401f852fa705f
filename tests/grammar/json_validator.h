// A small JSON Schema validator for the keywords engine/grammar supports (formats excepted:
// make_json_cases.py --check-walks checks those with the jsonschema package), written apart
// from the grammar compiler so that generated texts are checked by other code.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace flexh2o::grammar::testing {

// Empty when `instance` is valid, else the first violation found.
std::string schema_violation(const nlohmann::ordered_json& instance, const nlohmann::ordered_json& schema,
                             const nlohmann::ordered_json& root);

}  // namespace flexh2o::grammar::testing
