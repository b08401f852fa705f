// JSON in and out of template values: inputs (messages, tools) parsed from JSON keep their key
// order, as Python's json does; `tojson` writes what Python's json.dumps writes.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

Value from_json(const nlohmann::ordered_json& j);

struct JsonDumpOptions {
  bool ensure_ascii = false;           // transformers' tojson default
  std::optional<std::string> indent;   // None: one line
  std::string item_separator = ", ";   // json.dumps: ", " without indent, "," with
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// json.dumps(value, ...); throws TemplateError for what JSON cannot hold (Undefined, functions).
std::string dump_json(const Value& v, const JsonDumpOptions& opt, int line);

}  // namespace flexh2o::engine::chat
