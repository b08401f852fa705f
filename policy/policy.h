// How a run places and schedules a model (FlexGen's Policy): GPU batch size and number of
// GPU batches per block, the gpu/cpu/disk fractions of weights, KV cache and activations,
// and the scheduling switches. Loaded from YAML (`--policy FILE`) or CLI flags (`--percent`).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "offload/tiered_tensor.h"

namespace flexh2o::policy {

struct Policy {
  std::int64_t gpu_batch_size = 1;
  std::int64_t num_gpu_batches = 1;
  offload::TierFractions weights{1, 0, 0};
  offload::TierFractions cache{1, 0, 0};
  offload::TierFractions activations{1, 0, 0};
  bool overlap = true;            // prefetch/write back while computing
  bool sep_layer = true;          // attention and MLP are separate scheduling units
  bool pin_weight = true;         // pin cpu-tier memory (costs RAM that cannot be paged)
  // The tensors outside the decoder layers (input embedding, final norm, head) live wholly on
  // the gpu tier and are never staged; the weight fractions place the decoder layers. A tied
  // embedding/head staged is fetched twice per step (by the input embedding and the head units)
  // and sizes both staging slots by itself; resident, it is held once and the slots are sized
  // by the largest decoder unit.
  bool resident_embeddings = false;
  bool cpu_cache_compute = false; // decode attention over a cpu-homed KV runs on the CPU
  bool compress_weight = false;   // weight matrices stored group-quantized (kernels/quantize.h)
  bool compress_cache = false;    // KV cache stored group-quantized
  int compress_bits = 4;          // 4 or 8 bits per value when compressing
  // The KV cache's float dtype when not compressed; unset: the model's float dtype (f16 or bf16
  // as GPU engines keep it, f32 for an fp32 model).
  std::optional<kernels::DType> cache_storage;
  std::string kv = "full";        // KV policy spec (eviction)
  // Mixture-of-experts: which experts a unit load fetches. routed: only those the block's
  // rows route to (the router runs first); all: every expert, prefetched like a dense MLP;
  // auto: routed unless about all experts are expected to be active (see below).
  std::string expert_loading = "auto";
  // Experts a MoE unit's weight staging slot holds (0: sized by expert_slot_count below). A
  // block routed to more runs its MoE layers in chunks of experts.
  std::int64_t expert_slots = 0;
  // Where the pool of prefixes held once lives (docs/prefix-sharing.md, "Where it lives"): the
  // first of gpu, cpu, disk where it fits, from the one named here (a plan names the one it
  // planned); auto: from the gpu, nothing planned.
  std::string prefix_pool = "auto";

  kernels::DType compressed_dtype() const { return compress_bits == 8 ? kernels::DType::Q8 : kernels::DType::Q4; }
  // Storage of weight matrices and of the KV cache under this policy (`stored`: the model's
  // float dtype, the storage of its matrices without compression).
  kernels::DType weight_dtype(kernels::DType stored) const { return compress_weight ? compressed_dtype() : stored; }
  kernels::DType cache_dtype(kernels::DType stored) const {
    return compress_cache ? compressed_dtype() : cache_storage.value_or(stored);
  }

  std::int64_t block_size() const { return gpu_batch_size * num_gpu_batches; }
  // Whether a MoE unit load for `tokens` routed rows fetches only the routed experts: under
  // auto, while fewer than experts - 0.5 are expected active (large batches touch them all,
  // and then prefetching them all keeps their copy overlapped with the attention before), and
  // always when the staging slots hold fewer than all experts.
  bool routed_expert_loading(std::int64_t experts, std::int64_t top_k, std::int64_t tokens) const;
  // The experts a MoE unit's staging slot holds: expert_slots when set; every expert under
  // `all` loading; otherwise those a decode step of a block (block_size() rows) is expected to
  // route to, rounded up, at least top_k. At most `experts`. Throws when `all` loading is
  // given fewer slots than experts.
  std::int64_t expert_slot_count(std::int64_t experts, std::int64_t top_k) const;
  // FlexGen's --percent WG WC CG CC AG AC (disk gets the rest of each pair).
  void set_percent(const std::array<double, 6>& percent);
  std::array<double, 6> percent() const;
  // Throws std::invalid_argument naming `source` and the field.
  void validate(const std::string& source = "policy") const;
};

// Distinct experts that `tokens` rows, each routed to top_k of `experts`, are expected to
// touch when routing is uniform: E * (1 - (1 - k/E)^T).
double expected_active_experts(std::int64_t experts, std::int64_t top_k, std::int64_t tokens);

// Keys: gpu_batch_size, num_gpu_batches, percent: [WG, WC, CG, CC, AG, AC], overlap,
// sep_layer, pin_weight, resident_embeddings, cpu_cache_compute, compress_weight, compress_cache, compress_bits,
// cache_dtype (f32, f16 or bf16; absent: the model's float dtype), kv, expert_loading (auto,
// routed or all), expert_slots, prefix_pool (auto, gpu, cpu or disk). Missing keys
// keep their defaults; unknown keys are errors (a typo must not silently change a run).
Policy load_policy_yaml(const std::string& yaml_text, const std::string& source);
Policy load_policy_file(const std::string& path);
std::string policy_to_yaml(const Policy& p);

}  // namespace flexh2o::policy
