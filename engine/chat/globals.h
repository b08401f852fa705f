// The names every template sees: jinja2's range, dict and namespace, and transformers'
// raise_exception and strftime_now.
#pragma once
#include <ctime>
#include <optional>

#include "engine/chat/interpreter.h"

namespace flexh2o::engine::chat {

// `now`: the time strftime_now formats; nullopt reads the local clock at each call.
void add_globals(Scope& scope, const std::optional<std::tm>& now);

// Python's datetime.strftime of a naive datetime (%f is 000000; %z and %Z are empty).
std::string format_time(const std::string& format, const std::tm& t, int line);

}  // namespace flexh2o::engine::chat
