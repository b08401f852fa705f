// `flexh2o chat-template`: renders a conversation with a chat template, exactly as the model
// would be prompted (transformers' apply_chat_template), and prints the text with nothing added.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace flexh2o::cli {

struct ChatTemplateOptions {
  std::string template_file;  // a Jinja file; or
  std::string model;          // a model directory or GGUF file: its own template and tokens
  std::string template_name;  // one of the model's named templates
  std::string messages_file;  // a JSON array of messages (or {"messages": [...], "tools": [...]})
  std::string tools_file;     // a JSON array of tools
  bool no_generation_prompt = false;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> date;  // pins strftime_now
};

CLI::App* add_chat_template_command(CLI::App& app, ChatTemplateOptions& opt);
int chat_template_command(const ChatTemplateOptions& opt);

}  // namespace flexh2o::cli
