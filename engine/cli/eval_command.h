// `flexh2o eval`: teacher-forced quality of KV eviction policies and 4-bit compression against
// the full, uncompressed model.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace flexh2o::cli {

struct EvalOptions {
  std::string model;
  std::string tokenizer;
  bool dummy = false;
  std::string text_file;
  std::string kv = "full,local:0.2,streaming:0.2,h2o:0.2,tova:0.2,scissorhands:0.2,pyramid:0.2,snapkv:0.2";
  std::string compress = "none";  // comma list of none, cache, weight, both
  std::string compute_dtypes = "f32";  // comma list of f32, bf16
  int compress_bits = 4;
  std::int64_t chunks = 64;
  std::int64_t skip = 0;       // paragraphs skipped before the first chunk
  std::string prefill = "1";   // prompt of each chunk: a fraction (0.5) or a token count (1: BOS only)
  std::string backend = "auto";
  std::int64_t batch = 16;
  std::string csv_file;
};

CLI::App* add_eval_command(CLI::App& app, EvalOptions& opt);
int eval_command(const EvalOptions& opt);

}  // namespace flexh2o::cli
