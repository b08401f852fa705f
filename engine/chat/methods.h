// Attribute and item access as jinja2's sandbox does it: `x.name` tries the Python attribute
// (a method of str, list or dict) and then the item; `x[key]` tries the item and then the
// attribute. Methods that modify a list or dict are refused, as in transformers'
// ImmutableSandboxedEnvironment. A miss is Undefined; any use of Undefined's own attributes fails.
#pragma once
#include <string>

#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

Value get_attribute(const Value& obj, const std::string& name, int line);
Value get_item(const Value& obj, const Value& key, int line);
// obj[start:stop:step] of a list, tuple or str (each bound may be None).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);

}  // namespace flexh2o::engine::chat
