// jinja2's tests (`value is name(args)`).
#pragma once
#include <string>

#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

bool is_jinja_test(const std::string& name);
bool apply_test(Interpreter& in, const std::string& name, const Value& value, CallArgs& args);

}  // namespace flexh2o::engine::chat
