// JSON Schema documents (and "any JSON") as grammars of their JSON text. What is supported,
// the whitespace and property-order policy, and the errors: docs/structured-output.md.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

#include "engine/grammar/grammar.h"

namespace flexh2o::grammar {

struct JsonOptions {
  // Whitespace bytes (space, tab, newline) allowed after '{', '[', ',', ':' and after each
  // value inside an object or array; 0 writes compact JSON.
  std::uint32_t max_whitespace = 20;
};

// Throws std::invalid_argument naming the schema location ("/properties/a") and the keyword
// for what is not supported or cannot be satisfied.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonOptions& options = {});

// Any JSON object (OpenAI's {"type": "json_object"}).
Grammar json_object_grammar(const JsonOptions& options = {});

}  // namespace flexh2o::grammar
