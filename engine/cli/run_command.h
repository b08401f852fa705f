// `flexh2o run`: batched offline generation.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

namespace flexh2o::cli {

struct RunOptions {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  std::string prompts_file;
  std::string out_file;
  std::optional<std::int64_t> gen_len;
  std::int64_t batch = 1;
  std::int64_t prompt_len = 8;  // synthetic prompts (no --prompt/--prompts, model without tokenizer)
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::uint64_t seed = 0;
  bool dummy = false;
  std::string dtype;
};

CLI::App* add_run_command(CLI::App& app, RunOptions& opt);
int run_command(const RunOptions& opt);

}  // namespace flexh2o::cli
