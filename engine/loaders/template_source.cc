#include "engine/loaders/template_source.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/loaders/gguf_file.h"
#include "engine/io/json_input.h"
#include "offload/text_file.h"
#include "kernels/option_error.h"

namespace flexh2o::engine::chat {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  auto text = offload::read_text_file(p.string());
  if (!text) throw std::runtime_error("cannot read " + p.string());
  return std::move(*text);
}

nlohmann::json read_json(const fs::path& p) { return parse_json(read_file(p), p.string()); }

// A special token in tokenizer_config.json: "<s>", {"content": "<s>", ...} or null.
std::optional<std::string> token_text(const nlohmann::json& config, const char* key, const fs::path& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  throw std::runtime_error(file.string() + ": " + key + " is neither a string nor {\"content\": ...}");
}

std::string pick_named(const nlohmann::json& list, const std::string& wanted, bool has_tools, const fs::path& file) {
  std::map<std::string, std::string> named;
  for (const auto& entry : list) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
        !entry["template"].is_string()) {
      throw std::runtime_error(file.string() + ": chat_template list entries must be {\"name\": ..., \"template\": ...}");
    }
    named[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
  }
  std::string choice = wanted;
  if (choice.empty()) choice = has_tools && named.count("tool_use") ? "tool_use" : "default";
  const auto it = named.find(choice);
  if (it != named.end()) return it->second;
  std::string names;
  for (const auto& [n, t] : named) names += (names.empty() ? "" : ", ") + n;
  throw kernels::OptionRuntimeError{file.string() + ": no chat template named '" + choice + "' (it has: " + names +
                                        "); choose one with ",
                                    kernels::Option::TemplateName};
}

TemplateSource from_directory(const fs::path& dir, const std::string& template_name, bool has_tools) {
  TemplateSource src;
  const fs::path config_path = dir / "tokenizer_config.json";
  nlohmann::json config = fs::exists(config_path) ? read_json(config_path) : nlohmann::json::object();
  const fs::path special_path = dir / "special_tokens_map.json";
  const nlohmann::json special = fs::exists(special_path) ? read_json(special_path) : nlohmann::json::object();
  src.bos_token = token_text(config, "bos_token", config_path);
  src.eos_token = token_text(config, "eos_token", config_path);
  if (!src.bos_token) src.bos_token = token_text(special, "bos_token", special_path);
  if (!src.eos_token) src.eos_token = token_text(special, "eos_token", special_path);

  const fs::path named_file = dir / "additional_chat_templates" / (template_name + ".jinja");
  if (!template_name.empty() && template_name != "default" && fs::exists(named_file)) {
    src.text = read_file(named_file);
    src.name = named_file.string();
    return src;
  }
  const fs::path jinja = dir / "chat_template.jinja";
  if ((template_name.empty() || template_name == "default") && fs::exists(jinja)) {
    src.text = read_file(jinja);
    src.name = jinja.string();
    return src;
  }
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    throw kernels::OptionRuntimeError{
        dir.string() + " has no chat template (no chat_template.jinja, no \"chat_template\" in tokenizer_config.json); "
                       "pass one with ",
        kernels::Option::ChatTemplate};
  }
  if (it->is_string()) {
    if (!template_name.empty() && template_name != "default") {
      throw std::runtime_error(config_path.string() + " has one chat template; there is none named '" + template_name + "'");
    }
    src.text = it->get<std::string>();
  } else if (it->is_array()) {
    src.text = pick_named(*it, template_name, has_tools, config_path);
  } else {
    throw std::runtime_error(config_path.string() + ": chat_template must be a string or a list of named templates");
  }
  src.name = config_path.string() + " (chat_template)";
  return src;
}

std::optional<std::string> gguf_token(const GgufHeader& h, const char* id_key) {
  const auto id = h.get_uint(id_key);
  const auto* tokens = h.get_strings("tokenizer.ggml.tokens");
  if (!id || !tokens) return std::nullopt;
  if (*id >= tokens->size()) h.fail_key(id_key, "= " + std::to_string(*id) + " is outside the vocabulary");
  return (*tokens)[*id];
}

TemplateSource from_gguf(const fs::path& file, const std::string& template_name) {
  GgufFile gguf(file.string());
  const GgufHeader& h = gguf.header();
  const std::string key = template_name.empty() || template_name == "default"
                              ? "tokenizer.chat_template"
                              : "tokenizer.chat_template." + template_name;
  const auto text = h.get_string(key);
  if (!text)
    throw kernels::OptionRuntimeError{file.string() + " has no " + key + "; pass ", kernels::Option::ChatTemplate};
  TemplateSource src;
  src.text = *text;
  src.name = file.string() + " (" + key + ")";
  src.bos_token = gguf_token(h, "tokenizer.ggml.bos_token_id");
  src.eos_token = gguf_token(h, "tokenizer.ggml.eos_token_id");
  return src;
}

}  // namespace

TemplateSource load_template_file(const std::string& path) {
  TemplateSource src;
  src.text = read_file(path);
  src.name = path;
  return src;
}

TemplateSource load_model_template(const std::string& model, const std::string& template_name, bool has_tools) {
  const fs::path p(model);
  if (fs::is_directory(p)) return from_directory(p, template_name, has_tools);
  if (is_gguf_file(p.string())) return from_gguf(p, template_name);
  using kernels::Option;
  if (!fs::exists(p)) throw kernels::OptionRuntimeError{Option::Model, " " + model + ": no such file or directory"};
  throw kernels::OptionRuntimeError{
      Option::Model, " " + model + ": a chat template comes from a Hugging Face model directory or a GGUF file; pass ",
      Option::ChatTemplate};
}

}  // namespace flexh2o::engine::chat
