// Where a model keeps its chat template, and its BOS/EOS token text:
//   a Hugging Face directory: chat_template.jinja (transformers saves it there; it wins), else
//     tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"}:
//     the named one, else "tool_use" when tools are given and it exists, else "default"),
//     with named ones also in additional_chat_templates/NAME.jinja; bos_token / eos_token from
//     tokenizer_config.json (or special_tokens_map.json);
//   a GGUF file: tokenizer.chat_template (named: tokenizer.chat_template.NAME), the tokens
//     tokenizer.ggml.bos_token_id / eos_token_id name.
// Errors name the file and what is missing, and say what to pass instead.
#pragma once
#include <optional>
#include <string>

namespace flexh2o::engine::chat {

struct TemplateSource {
  std::string text;
  std::string name;  // where it came from, for messages
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

TemplateSource load_template_file(const std::string& path);
// `template_name` empty: the model's default choice (see above).
TemplateSource load_model_template(const std::string& model, const std::string& template_name, bool has_tools);

}  // namespace flexh2o::engine::chat
