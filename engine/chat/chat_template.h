// A model's chat template: parsed once, rendered per conversation as transformers'
// apply_chat_template renders it (render_jinja_template): the variables messages, tools,
// documents, add_generation_prompt, bos_token and eos_token (when known) and any extra ones
// (enable_thinking, ...); a message's keys whose value is null are dropped, and messages
// carrying reasoning get it under every name templates read (thinking, reasoning_content), as
// transformers does.
#pragma once
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/chat/interpreter.h"

namespace flexh2o::engine::chat {

// A template that does not parse or that fails while rendering (its raise_exception included):
// the message names the template and the line, then says what went wrong.
class ChatTemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::optional<nlohmann::ordered_json> tools;      // absent: None
  std::optional<nlohmann::ordered_json> documents;  // absent: None
  bool add_generation_prompt = true;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more template variables
  std::optional<std::tm> now;  // what strftime_now formats; absent: the local clock
};

class ChatTemplate {
 public:
  // Parses `source`; `name` (a file, "tokenizer_config.json", ...) prefixes error messages.
  ChatTemplate(const std::string& source, std::string name, RenderLimits limits = {});
  std::string render(const ChatInputs& inputs) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  RenderLimits limits_;
  Body body_;
};

// "YYYY-MM-DD" or "YYYY-MM-DDTHH:MM:SS" as a calendar time; throws std::invalid_argument.
std::tm parse_date(const std::string& text);

}  // namespace flexh2o::engine::chat
