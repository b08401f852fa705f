// Python's string formatting as sandboxed jinja2 lets templates use it: str.format and
// str.format_map (string.Formatter with the format-spec mini-language; a field's .attr and [key]
// read through the sandbox, as jinja2's SandboxedFormatter does) and printf-style formatting
// (the `%` operator on a string and the `format` filter).
#pragma once
#include <string>
#include <vector>

#include "engine/chat/value.h"

namespace flexh2o::engine::chat {

// fmt.format(*args, **kwargs); `kwargs` is a dict (format_map's mapping). `escape`: fmt is a
// Markup, whose fields are HTML-escaped unless they are Markup themselves.
std::string format_braces(const std::string& fmt, const std::vector<Value>& args, const Value& kwargs, bool escape,
                          int line);
// Python's format(value, spec) for None, bool, int, float and str; other values take only "".
std::string format_value(const Value& v, const std::string& spec, int line);
// fmt % args: a tuple gives the arguments in order, a dict (or list) is also read by %(key)s,
// anything else is the one argument.
std::string format_percent(const std::string& fmt, const Value& args, bool escape, int line);

}  // namespace flexh2o::engine::chat
