// `flexh2o tokenize`: text -> token ids as a JSON array, or with --decode ids -> text (like
// llama.cpp's llama-tokenize).
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace flexh2o::cli {

struct TokenizeOptions {
  std::string model;      // its tokenizer and, for GPT-2 vocab files, its config's BOS
  std::string tokenizer;  // a tokenizer file alone (or overriding the model's)
  std::optional<std::string> text;  // may be empty
  std::optional<std::string> file;
  bool special = false;  // encode: add the special tokens the model takes; decode: print them
  bool decode = false;
};

CLI::App* add_tokenize_command(CLI::App& app, TokenizeOptions& opt);
int tokenize_command(const TokenizeOptions& opt);

}  // namespace flexh2o::cli
