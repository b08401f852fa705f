#include "engine/cli/chat_template_command.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/chat/chat_template.h"
#include "engine/loaders/template_source.h"
#include "engine/io/json_input.h"
#include "offload/text_file.h"

namespace flexh2o::cli {

using engine::chat::ChatInputs;

CLI::App* add_chat_template_command(CLI::App& app, ChatTemplateOptions& o) {
  auto* cmd = app.add_subcommand("chat-template", "Print a conversation as a chat template renders it (no newline added)");
  auto* file = cmd->add_option("--template", o.template_file, "the Jinja chat template file");
  auto* model = cmd->add_option("--model", o.model,
                                "a Hugging Face model directory or GGUF file: use its own template, BOS and EOS")
                    ->excludes(file);
  file->excludes(model);
  cmd->add_option("--template-name", o.template_name, "with --model: which of its named templates (e.g. tool_use)")
      ->needs(model);
  cmd->add_option("--messages", o.messages_file,
                  "JSON file: an array of messages, or an object with \"messages\" (and \"tools\")")
      ->required();
  cmd->add_option("--tools", o.tools_file, "JSON file: an array of tools (function schemas)");
  cmd->add_flag("--no-generation-prompt", o.no_generation_prompt, "do not end with the assistant's turn opener");
  cmd->add_option("--bos-token", o.bos_token, "the BOS text the template may print (default: the model's, else undefined)");
  cmd->add_option("--eos-token", o.eos_token, "the EOS text the template may print (default: the model's, else undefined)");
  cmd->add_option("--date", o.date, "the date strftime_now formats, YYYY-MM-DD (default: today)");
  return cmd;
}

namespace {

nlohmann::ordered_json read_json(const std::string& path, const char* flag) {
  const auto text = offload::read_text_file(path);
  if (!text) throw std::invalid_argument(std::string(flag) + ": cannot read " + path);
  return engine::parse_json<nlohmann::ordered_json>(*text, std::string(flag) + " " + path);
}

ChatInputs read_inputs(const ChatTemplateOptions& o) {
  ChatInputs in;
  nlohmann::ordered_json messages = read_json(o.messages_file, "--messages");
  if (messages.is_object()) {
    if (!messages.contains("messages")) throw std::invalid_argument("--messages " + o.messages_file + ": no \"messages\"");
    if (messages.contains("tools") && !messages["tools"].is_null()) in.tools = messages["tools"];
    messages = messages["messages"];
  }
  if (!messages.is_array()) {
    throw std::invalid_argument("--messages " + o.messages_file + ": expected a JSON array of messages");
  }
  in.messages = std::move(messages);
  if (!o.tools_file.empty()) {
    in.tools = read_json(o.tools_file, "--tools");
    if (!in.tools->is_array()) throw std::invalid_argument("--tools " + o.tools_file + ": expected a JSON array of tools");
  }
  in.add_generation_prompt = !o.no_generation_prompt;
  if (o.date) in.now = engine::chat::parse_date(*o.date);
  return in;
}

}  // namespace

int chat_template_command(const ChatTemplateOptions& o) {
  if (o.template_file.empty() == o.model.empty()) throw std::invalid_argument("chat-template needs --template FILE or --model M");
  ChatInputs in = read_inputs(o);
  const engine::chat::TemplateSource src = o.model.empty()
                                               ? engine::chat::load_template_file(o.template_file)
                                               : engine::chat::load_model_template(o.model, o.template_name, in.tools.has_value());
  in.bos_token = o.bos_token ? o.bos_token : src.bos_token;
  in.eos_token = o.eos_token ? o.eos_token : src.eos_token;
  const std::string text = engine::chat::ChatTemplate(src.text, src.name).render(in);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace flexh2o::cli
