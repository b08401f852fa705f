// jinja2's filters (`value | name(args)`) with jinja2's semantics, and transformers' tojson.
#pragma once
#include <string>

#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

// Whether jinja2 (with transformers' environment) knows the filter: an unknown one is an error
// when the template is parsed, as in jinja2.
bool is_jinja_filter(const std::string& name);
// Applies the filter; a filter jinja2 has but this engine does not implement is a TemplateError.
Value apply_filter(Interpreter& in, const std::string& name, const Value& value, CallArgs& args);

}  // namespace flexh2o::engine::chat
