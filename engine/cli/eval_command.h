// `flexh2o eval`: teacher-forced quality of KV eviction policies and 4-bit compression against
// the full, uncompressed model (engine/job/eval.h), as a table and CSV.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "engine/job/eval.h"

namespace flexh2o::cli {

struct EvalCliOptions {
  job::EvalOptions eval;
  std::string text_file;
  std::string compress = "none";       // comma list of none, cache, weight, both
  std::string compute_dtypes = "f32";  // comma list of f32, bf16
  std::string csv_file;
};

CLI::App* add_eval_command(CLI::App& app, EvalCliOptions& opt);
int eval_command(const EvalCliOptions& opt);

}  // namespace flexh2o::cli
