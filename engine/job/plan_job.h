// `plan`'s job: the planner over a model's shape (no weights read) and a job's lengths on a
// hardware profile, as `run` plans; its choice, or the prediction of a given policy.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/job/job_options.h"
#include "engine/model/model_config.h"
#include "policy/cost_model.h"
#include "policy/pipeline.h"

namespace flexh2o::job {

struct PlanJobOptions {
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
  std::string policy_file;  // predict this policy instead of searching
  Compression compress;
  std::int64_t pipeline = 1;  // stages (ranks), each on the hardware profile
  std::optional<std::int64_t> micro_batches;
};

// What the planner chose or predicted, and what it planned with.
struct PlannedJob {
  engine::ModelConfig config;
  policy::ModelShape shape;  // config's, as the planner sees it
  policy::HardwareProfile hw;
  policy::Workload workload;
  policy::PlanOptions options;
  policy::Estimate estimate;                          // one process: the chosen (or given) policy's
  std::vector<policy::Estimate> ranked;               // the search's best, best first (when it searched)
  std::optional<policy::PipelineEstimate> pipeline;   // pipeline N: the stages and their throughput
  std::int64_t micro_batches = 0;                     // pipeline N: blocks in flight
};

// Plans (or predicts the given policy of) `o`, keeping the search's `ranked` best.
PlannedJob plan_job(const PlanJobOptions& o, std::size_t ranked);

// A model config from a built-in name, a model YAML, a Hugging Face directory or a llama2.c file
// (only the shape: nothing is read).
engine::ModelConfig model_config_of(const std::string& model);

}  // namespace flexh2o::job
