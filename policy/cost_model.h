// FlexGen's cost model and placement search (ALGORITHMS.md section 3), extended with what
// flexh2o runs: exact row-split fractions, the KV eviction budget (KV term sized by the budget
// plus the policy's score arrays), cpu_cache_compute, embeddings, and the engine's own
// working set (two weight staging slots, KV/hidden staging rings, activation scratch).
// For one (gbs, K) the placement is a small LP solved with GLPK; the search walks gbs and K.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dtype.h"
#include "offload/tier.h"
#include "policy/eviction/kv_spec.h"
#include "policy/hardware_profile.h"
#include "policy/policy.h"

namespace flexh2o::policy {

// The model as the planner sees it (engine::ModelConfig provides it).
struct ModelShape {
  std::string name;
  std::int64_t layers = 0, hidden = 0, ffn = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  bool gated_mlp = false;        // LLaMA: gate, up, down; OPT: fc1, fc2
  bool tied_embeddings = false;  // the output head reuses the input embedding
  kernels::DType weight_dtype = kernels::DType::F16;  // storage of the matrices (q4: compress_weight)
  kernels::DType cache_dtype = kernels::DType::F32;   // storage of the KV cache (with_compression sets it)
  std::int64_t extra_embedding_rows = 0;  // OPT's learned positions
  // Under compress_weight, matrices a checkpoint already stores in one of the engine's group
  // formats keep it (GGUF Q4_0/Q4_1/Q8_0 blocks: q4g32/q8g32) instead of taking the policy's.
  // Per part (decoder layers, input embedding, output head): the widest such format, and
  // whether some matrices of the part have none (those take the policy's).
  struct KeptFormat {
    std::optional<kernels::DType> widest;
    bool partial = false;
  };
  KeptFormat kept_layers{}, kept_embedding{}, kept_head{};
  // Storage of the embedding (+ positions) and of the head where it is not weight_dtype
  // (with_compression sets them from the kept formats).
  std::optional<kernels::DType> embedding_dtype{}, head_dtype{};
};

struct Workload {
  std::int64_t prompt_len = 512;
  std::int64_t gen_len = 32;
};

// Sizes the engine allocates, in bytes (unit tests check them by hand).
struct ModelSizes {
  std::int64_t layer_weights = 0;      // one decoder layer (attention + MLP)
  std::int64_t embedding_weights = 0;  // input embedding (+ positions) + untied head
  std::int64_t total_weights = 0;
  std::int64_t largest_unit = 0;       // the biggest scheduling unit: what a staging slot holds
  std::int64_t layer_params = 0;       // elements of one decoder layer's matrices
  std::int64_t kv_per_token_layer = 0; // K and V, one token, one layer, in the cache dtype
  std::int64_t hidden_per_token = 0;   // fp32 residual stream
};
ModelSizes model_sizes(const ModelShape& m);
// The shape as stored under the policy's compress_weight / compress_cache / cache_dtype.
ModelShape with_compression(ModelShape m, const Policy& p);
// Tokens a sequence's KV occupies per head: prompt + gen, or the eviction budget's slots.
std::int64_t kv_tokens(const ModelShape& m, const Workload& w, const KvSpec& kv);

struct Estimate {
  Policy policy;
  double prefill_seconds = 0, decode_seconds = 0;  // one block
  double prefill_throughput = 0, decode_throughput = 0, total_throughput = 0;  // tokens/s
  std::array<std::int64_t, 3> peak_bytes{};  // gpu, cpu, disk
  std::string bottleneck;                    // the decode term that sets the step time
};

struct PlanOptions {
  KvSpec kv = parse_kv_spec("full");
  bool allow_cpu_cache_compute = true;
  double memory_safety = 0.9;  // fraction of each tier the plan may use
  std::int64_t max_block = 1 << 14;
  // Plan for compressed weights / KV, or an fp16 KV (the chosen policy carries the same).
  bool compress_weight = false, compress_cache = false;
  int compress_bits = 4;
  kernels::DType cache_storage = kernels::DType::F32;
};

// The cost of one fixed policy (the fractions and compression as given); nullopt when it does not fit.
std::optional<Estimate> estimate(const ModelShape& m, const HardwareProfile& hw, const Workload& w,
                                 const Policy& p, const PlanOptions& o = {});

// Why a fixed policy does not fit: the first tier over its share, what it would hold there
// (largest first) and what it may use (the plan's safety fraction of the tier).
struct Shortfall {
  offload::Tier tier = offload::Tier::Gpu;
  std::int64_t need = 0, available = 0, capacity = 0;
  double safety = 1;
  std::vector<std::pair<std::string, std::int64_t>> items;
  // "gpu tier needs 1.20 GiB (weights 800 MiB, KV cache 300 MiB, ...) but has 460 MiB (90% of 512 MiB)"
  std::string describe() const;
};
// nullopt when the policy fits.
std::optional<Shortfall> shortfall(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const Policy& p,
                                   const PlanOptions& o = {});
// estimate(), or std::invalid_argument "<what> does not fit <profile>: <shortfall>; <what to change>".
Estimate estimate_or_throw(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const Policy& p,
                           const PlanOptions& o, const std::string& what);

// The best policy found. Throws std::invalid_argument naming the smallest change that fits
// when nothing does (more memory on a tier, --disk-mem, or a KV budget).
Estimate plan(const ModelShape& m, const HardwareProfile& hw, const Workload& w, const PlanOptions& o = {});

}  // namespace flexh2o::policy
