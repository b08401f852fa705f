// What a batch job asks for, by meaning: the model, the requests and where their results go,
// sampling, placement and schedule, batching, tier capacities, ranks and reports. The CLI's
// `run` flags and the Python API's keyword arguments both fill one (each front end names the
// options its own way; the job layer's errors name them by kernels::Option, front_end.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "policy/cost_model.h"
#include "policy/policy.h"

namespace flexh2o::job {

// Weight and KV compression (FlexGen's), and the KV cache's float dtype.
struct Compression {
  bool weight = false, cache = false;
  std::optional<int> bits;  // bits per value: 4 (default) or 8
  std::string cache_dtype;  // f32, f16 or bf16; empty: the model's float dtype

  // Switches compression on (a policy file may already have); bits override.
  void apply(policy::Policy& p) const {
    p.compress_weight = p.compress_weight || weight;
    p.compress_cache = p.compress_cache || cache;
    if (bits) p.compress_bits = *bits;
    if (!cache_dtype.empty()) p.cache_storage = kernels::parse_dtype(cache_dtype);
  }
  void apply(policy::PlanOptions& o) const {
    o.compress_weight = weight;
    o.compress_cache = cache;
    o.compress_bits = bits.value_or(4);
    if (!cache_dtype.empty()) o.cache_storage = kernels::parse_dtype(cache_dtype);
  }
};

struct JobOptions {
  std::string model;  // empty: the embedded stories260K
  std::string tokenizer;
  std::string prompt;        // one prompt text, repeated `batch` times
  std::string prompts_file;  // JSONL prompts or an OpenAI batch file
  std::vector<std::string> request_lines;  // OpenAI batch request lines given in memory, in place of a file
  std::string out_file;      // results JSONL; empty: results go to stdout
  bool resume = false;
  std::optional<std::int64_t> gen_len;
  std::optional<std::int64_t> batch;
  std::int64_t prompt_len = 8;  // synthetic prompts (no prompt given, model without tokenizer)
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::uint64_t seed = 0;
  bool dummy = false;
  bool ignore_eos = false;  // every prompt generates gen_len tokens (the model's stop ids are not applied)
  std::string dtype;
  std::string backend = "auto";  // auto, cpu or cuda
  std::string compute_dtype = "auto";

  // Placement and schedule (FlexGen's); a policy file first, then these override it.
  std::string policy_file;  // a YAML file, or "auto"
  std::string hardware;     // the profile the planner plans with
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
  Compression compress;
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

}  // namespace flexh2o::job
