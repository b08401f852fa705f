// `flexh2o plan`: the cost-model planner as a dry run (no GPU, no weights needed).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "engine/cli/compression_flags.h"
#include "engine/model/model_config.h"
#include "policy/cost_model.h"

namespace flexh2o::cli {

struct PlanCliOptions {
  std::string model;
  std::string hardware;  // empty: this machine (backend, offload_dir)
  std::string backend = "auto", offload_dir;
  std::optional<std::int64_t> batch;  // the job's prompts: the largest block
  std::int64_t prompt_len = 512;  // the longest prompt
  std::int64_t gen_len = policy::kDefaultGenLen;      // the largest max_tokens
  // How run shares the block's slots (default continuous, as run); under continuous batching
  // the time follows the job's mean lengths (default: the maxima) and the prefill budget.
  std::optional<std::string> batching;
  std::optional<double> mean_prompt_len, mean_gen_len;
  std::optional<std::int64_t> prefill_budget;  // unset: policy::default_prefill_budget
  // Continuous batching: every prompt starts with one of `prefix_families` prefixes of
  // shared_prefix tokens (0: none), computed once and held once as run does.
  std::int64_t shared_prefix = 0, prefix_families = 1;
  std::string kv = "full";
  std::string gpu_mem, cpu_mem, disk_mem;
  std::string out_file;
  bool explain = false;
  std::string policy_file;  // predict this policy instead of searching
  CompressionFlags compress;
  std::int64_t pipeline = 1;  // stages (ranks), each on the hardware profile
  std::optional<std::int64_t> micro_batches;
};

CLI::App* add_plan_command(CLI::App& app, PlanCliOptions& opt);
int plan_command(const PlanCliOptions& opt);

// A model config from a built-in name, a model YAML, a Hugging Face directory or a llama2.c file.
engine::ModelConfig model_config_of(const std::string& model);

}  // namespace flexh2o::cli
