#include "engine/chat/chat_template.h"

#include <cstdio>

#include "engine/chat/globals.h"
#include "engine/chat/json_value.h"
#include "engine/chat/parser.h"
#include "engine/chat/text.h"

namespace flexh2o::engine::chat {

namespace {

std::string located(const std::string& name, const TemplateError& e) {
  return name + (e.line() > 0 ? ":" + std::to_string(e.line()) : "") + ": " + e.what();
}

// transformers' _alias_reasoning_fields: the first of reasoning_content, thinking, reasoning
// that is set becomes {"thinking": r, **message, "reasoning_content": r}.
Value alias_reasoning(const Value& message) {
  if (!message.is_dict()) return message;
  const DictObj& m = message.as_dict();
  const Value* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    const Value* v = m.find(Value(key));
    if (v && !v->is_none()) {
      reasoning = v;
      break;
    }
  }
  if (!reasoning) return message;
  Value out = Value::dict();
  out.as_dict().set(Value("thinking"), *reasoning);
  for (const auto& [k, v] : m.items) out.as_dict().set(k, v);
  out.as_dict().set(Value("reasoning_content"), *reasoning);
  return out;
}

// transformers' _normalize_chat_messages drops the keys whose value is None (OpenAI's
// "content": null beside tool_calls), which templates handle as missing; then the aliases.
Value messages_value(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) throw TemplateError("messages must be a JSON array of message objects", 0);
  std::vector<Value> out;
  for (const auto& m : messages) {
    if (!m.is_object()) throw TemplateError("chat messages must be JSON objects, but got " + m.dump(), 0);
    Value message = Value::dict();
    for (const auto& [k, v] : m.items()) {
      if (!v.is_null()) message.as_dict().set(Value(k), from_json(v));
    }
    out.push_back(alias_reasoning(message));
  }
  return Value::list(std::move(out));
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::string name, RenderLimits limits)
    : name_(std::move(name)), limits_(limits) {
  if (!valid_utf8(source)) throw ChatTemplateError(name_ + ": the template is not valid UTF-8");
  try {
    body_ = parse_template(source);
  } catch (const TemplateError& e) {
    throw ChatTemplateError(located(name_, e));
  }
}

std::string ChatTemplate::render(const ChatInputs& inputs) const {
  try {
    auto root = std::make_shared<Scope>();
    add_globals(*root, inputs.now);
    for (const auto& [k, v] : inputs.extra.items()) root->set(k, from_json(v));
    root->set("messages", messages_value(inputs.messages));
    root->set("tools", inputs.tools ? from_json(*inputs.tools) : Value(None{}));
    root->set("documents", inputs.documents ? from_json(*inputs.documents) : Value(None{}));
    root->set("add_generation_prompt", inputs.add_generation_prompt);
    if (inputs.bos_token) root->set("bos_token", *inputs.bos_token);
    if (inputs.eos_token) root->set("eos_token", *inputs.eos_token);
    Interpreter interpreter(limits_);
    return interpreter.render(body_, root);
  } catch (const TemplateError& e) {
    throw ChatTemplateError(located(name_, e));
  }
}

std::tm parse_date(const std::string& text) {
  std::tm t{};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  char tail = '\0';
  const int n = std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%c", &y, &mo, &d, &h, &mi, &s, &tail);
  const bool date_only = n == 3 && text.size() == 10;
  if (!(date_only || (n == 6 && text.size() == 19)) || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 ||
      s > 60) {
    throw std::invalid_argument("'" + text + "' is not a date: expected YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS");
  }
  t.tm_year = y - 1900;
  t.tm_mon = mo - 1;
  t.tm_mday = d;
  t.tm_hour = h;
  t.tm_min = mi;
  t.tm_sec = s;
  std::tm check = t;
  timegm(&check);  // fills the weekday and day of year, and shows whether the day exists
  if (check.tm_mday != d || check.tm_mon != mo - 1) throw std::invalid_argument("'" + text + "' is not a calendar date");
  return check;
}

}  // namespace flexh2o::engine::chat
