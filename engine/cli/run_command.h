// `flexh2o run`: batched offline generation.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/cli/compression_flags.h"

namespace flexh2o::cli {

struct RunOptions {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  std::string prompts_file;
  std::string out_file;
  bool resume = false;
  std::optional<std::int64_t> gen_len;
  std::optional<std::int64_t> batch;
  std::int64_t prompt_len = 8;  // synthetic prompts (no --prompt/--prompts, model without tokenizer)
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::uint64_t seed = 0;
  bool dummy = false;
  bool ignore_eos = false;  // every prompt generates gen_len tokens (the model's stop ids are not applied)
  std::string dtype;
  std::string backend = "auto";  // auto, cpu or cuda
  std::string compute_dtype = "auto";

  // Placement and schedule (FlexGen's flags); a --policy file first, then these override it.
  std::string policy_file;  // a YAML file, or "auto"
  std::string hardware;     // profile for --policy auto
  std::vector<double> percent;  // WG WC CG CC AG AC
  std::optional<int> resident_embeddings;  // embeddings and head wholly on the gpu tier
  std::optional<std::int64_t> gpu_batch_size;
  std::optional<std::int64_t> num_gpu_batches;
  std::optional<int> overlap, sep_layer, pin_weight;
  bool cpu_cache_compute = false;
  std::string kv;  // KV eviction spec
  std::string expert_loading;  // MoE: auto, routed or all
  std::string prefix_pool;     // where prefixes held once live: auto, gpu, cpu or disk
  std::optional<std::int64_t> expert_slots;  // MoE: experts a staging slot holds
  CompressionFlags compress;
  // Continuous batching (a finished request's slot takes the next at once) or fixed blocks,
  // and the prompt tokens a GPU batch's step prefills for newcomers (unset: the planner's
  // default for the backend, policy::default_prefill_budget).
  std::string batching = "continuous";
  std::optional<std::int64_t> prefill_budget;
  int share_prefill = 1;  // the n choices of a request share one prefill (0: each prefills its own)
  std::string cuda_graphs = "off";     // decode steps as CUDA graphs (docs/backends.md, "CUDA graphs")
  std::string prefix_sharing = "on";  // continuous batching: prompts take shared prefixes' KV (copy, off: the ablations)
  // Tier capacities and where the disk tier lives.
  std::string gpu_mem, cpu_mem, disk_mem;
  std::string offload_dir;
  // Several ranks (mpirun/srun): pipeline stages (1: data parallel) and blocks in flight.
  std::int64_t pipeline = 1;
  std::optional<std::int64_t> micro_batches;
  // Reports.
  std::string metrics_file;
  std::string trace_file;
  bool explain = false;  // the planner's prediction next to what the run measured
  bool quiet = false;    // no progress line
};

CLI::App* add_run_command(CLI::App& app, RunOptions& opt);
int run_command(const RunOptions& opt);

}  // namespace flexh2o::cli
