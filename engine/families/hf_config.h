// Reading a Hugging Face config.json: typed fields with defaults, and the fields both
// transformers 4 and 5 spell their own way (dtype, RoPE, head_dim, sliding windows).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/model/model_config.h"

namespace flexh2o::engine {

class HfConfig {
 public:
  HfConfig(nlohmann::json j, std::string source) : j_(std::move(j)), source_(std::move(source)) {}

  // Present and not null.
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  // The field, or `fallback` when absent or null (no fallback: an error naming the field).
  // An integer must be written as one (32.5 is an error, not 32) and fit T; a size field
  // (size_limit) must be within ModelLimits, checked here before a family allocates by it.
  template <class T>
  T get(const char* key, std::optional<T> fallback = std::nullopt) const {
    if (!has(key)) {
      if (!fallback) throw error("missing field '" + std::string(key) + "'");
      return *fallback;
    }
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      return static_cast<T>(integer(key, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
    }
    try {
      return j_[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      throw error("field '" + std::string(key) + "' has the wrong type");
    }
  }
  const nlohmann::json& raw() const { return j_; }
  // The limit of a size field of config.json (num_hidden_layers, hidden_size, ...); nullopt
  // for other fields.
  static std::optional<std::int64_t> size_limit(const std::string& key);
  const std::string& source() const { return source_; }
  std::invalid_argument error(const std::string& what) const { return std::invalid_argument(source_ + ": " + what); }
  // A field the engine does not implement must be absent or hold its neutral value.
  template <class T>
  void refuse_unless(const char* key, const T& neutral, const std::string& why) const {
    if (has(key) && get<T>(key) != neutral)
      throw error("field '" + std::string(key) + "' is set: " + why + " is not supported");
  }

 private:
  // The integer field `key`, in [lo, hi] and within its size_limit.
  std::int64_t integer(const char* key, std::int64_t lo, std::int64_t hi) const;

  nlohmann::json j_;
  std::string source_;
};

// `dtype` (transformers >= 4.56) or `torch_dtype`; float16 when neither is given.
kernels::DType read_dtype(const HfConfig& j);
// bos_token_id and eos_token_id (an id or a list) from config.json.
void read_special_ids(const HfConfig& j, ModelConfig& c);
// RoPE from `rope_parameters` (v5) or `rope_theta` + `rope_scaling` (v4; `type` or
// `rope_type`), theta defaulting to `default_theta`; partial_rotary_factor and
// original_max_position_embeddings from inside or the top level. Unknown types are errors.
RopeConfig read_rope(const HfConfig& j, double default_theta);
// Per-layer windows from `layer_types` (sliding_attention / full_attention) when present,
// else from `is_sliding(layer)`; each sliding layer gets `sliding_window`.
std::vector<std::int64_t> read_layer_windows(const HfConfig& j, std::int64_t layers, bool (*is_sliding)(const HfConfig&, std::int64_t));
// The activation of `key` (silu, gelu, gelu_pytorch_tanh, relu, ...), or an error naming it.
kernels::Activation read_activation(const HfConfig& j, const char* key, const std::string& fallback);
// Fields every family refuses until implemented: quantized checkpoints, and MoE experts in a
// family without them (`experts` false).
void refuse_unimplemented(const HfConfig& j, bool experts = false);
// Mixture-of-experts fields (num_local_experts or num_experts, num_experts_per_tok,
// moe_intermediate_size (else intermediate_size), norm_topk_prob (default `norm_default`),
// shared_expert_intermediate_size; MoE layers from mlp_only_layers and decoder_sparse_step).
MoeConfig read_moe(const HfConfig& j, std::int64_t layers, bool norm_default);

}  // namespace flexh2o::engine
