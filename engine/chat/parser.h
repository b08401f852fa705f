// jinja2's grammar, for the statements and expressions chat templates use. What jinja2 has
// but this engine does not (include, extends, recursive loops, ...) is a TemplateError naming
// the construct and its line, raised when the template is parsed.
#pragma once
#include <string>

#include "engine/chat/ast.h"

namespace flexh2o::engine::chat {

Body parse_template(const std::string& source);

}  // namespace flexh2o::engine::chat
