#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "engine/model/weights.h"

namespace flexh2o::engine {

float ModelConfig::attention_scale() const {
  return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

std::int64_t ModelConfig::position_limit() const {
  if (!rotary()) return max_positions;
  switch (rope.type) {
    case RopeType::Dynamic:
      return std::numeric_limits<std::int32_t>::max();
    case RopeType::Linear:
    case RopeType::Yarn: {
      const std::int64_t original = rope.original_max_positions > 0 ? rope.original_max_positions : max_positions;
      return std::max(max_positions, static_cast<std::int64_t>(static_cast<double>(original) * std::max(rope.factor, 1.0)));
    }
    default:
      return max_positions;
  }
}

std::int64_t ModelConfig::window(std::int64_t layer) const {
  return layer_window.empty() ? 0 : layer_window[static_cast<std::size_t>(layer)];
}

std::int64_t ModelConfig::weight_bytes() const {
  std::int64_t total = 0;
  for (const WeightSpec& w : weight_specs(*this)) total += w.rows * kernels::row_bytes(w.dtype(*this), w.cols);
  return total;
}

void check_size_field(const std::string& source, const std::string& field, std::int64_t value, std::int64_t limit) {
  if (value < 0 || value > limit)
    throw std::invalid_argument(source + ": field '" + field + "' = " + std::to_string(value) +
                                (value < 0 ? " is negative" : " is beyond the limit of " + std::to_string(limit)) +
                                " (no real model comes near it); is the file corrupt?");
}

void ModelConfig::check_limits(const std::string& source) const {
  using L = ModelLimits;
  check_size_field(source, "num_layers", n_layers, L::kLayers);
  check_size_field(source, "hidden_size", hidden, L::kHidden);
  check_size_field(source, "embedding width", embed_dim, L::kHidden);
  check_size_field(source, "ffn_size", ffn, L::kFfn);
  check_size_field(source, "num_heads", n_heads, L::kHeads);
  check_size_field(source, "num_kv_heads", n_kv_heads, L::kHeads);
  check_size_field(source, "head_dim", head_dim, L::kHeadDim);
  check_size_field(source, "num_heads x head_dim", n_heads * head_dim, L::kHidden);
  check_size_field(source, "vocab_size", vocab_size, L::kVocab);
  check_size_field(source, "max_positions", max_positions, L::kPositions);
  check_size_field(source, "original_max_positions", rope.original_max_positions, L::kPositions);
  for (const auto w : layer_window) check_size_field(source, "sliding_window", w, L::kPositions);
  check_size_field(source, "num_experts", moe.experts, L::kExperts);
  check_size_field(source, "experts_per_token", moe.top_k, L::kExperts);
  check_size_field(source, "expert_ffn_size", moe.expert_ffn, L::kFfn);
  check_size_field(source, "shared_expert_ffn_size", moe.shared_ffn, L::kFfn);
  for (const double v : {rope.theta, rope.partial_rotary_factor, rope.factor, rope.low_freq_factor, rope.high_freq_factor,
                         rope.attention_factor, rope.beta_fast, rope.beta_slow, rope.mscale, rope.mscale_all_dim})
    if (!std::isfinite(v)) throw std::invalid_argument(source + ": a RoPE parameter is not a finite number");
  if (std::abs(rope.factor) > L::kRopeFactor)
    throw std::invalid_argument(source + ": rope scaling factor " + std::to_string(rope.factor) + " is beyond the limit of " +
                                std::to_string(static_cast<std::int64_t>(L::kRopeFactor)));
  if (!std::isfinite(norm_eps)) throw std::invalid_argument(source + ": norm_eps is not a finite number");
}

namespace {

// Every tensor's bytes are below 2^50 when the sizes are within ModelLimits; the sum is
// checked as it grows.
void check_weight_total(const ModelConfig& c, const std::string& source) {
  std::int64_t total = 0;
  for (const WeightSpec& w : weight_specs(c)) {
    const std::int64_t bytes = w.rows * kernels::row_bytes(w.dtype(c), w.cols);
    if (__builtin_add_overflow(total, bytes, &total) || total > ModelLimits::kWeightBytes)
      throw std::invalid_argument(source + ": the weights come to more than " +
                                  std::to_string(ModelLimits::kWeightBytes >> 50) + " PiB; is the file corrupt?");
  }
}

}  // namespace

void ModelConfig::validate(const std::string& source) const {
  check_limits(source);
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(source + ": " + what);
  };
  need(n_layers > 0, "num_layers must be positive");
  need(hidden > 0, "hidden_size must be positive");
  need(ffn > 0, "ffn_size must be positive");
  need(n_heads > 0, "num_heads must be positive");
  need(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "num_kv_heads must divide num_heads");
  need(head_dim > 0 && head_dim % 2 == 0, "head_dim must be positive and even");
  need(vocab_size > 0 && vocab_size < (std::int64_t{1} << 31), "vocab_size must be in [1, 2^31)");
  need(max_positions > 0, "max_positions must be positive");
  need(embed_dim >= 0, "the embedding width must not be negative");
  need(norm_eps > 0.0f, "norm_eps must be positive");
  if (moe.experts > 0) {
    need(moe.top_k > 0 && moe.top_k <= moe.experts, "experts per token must be in [1, experts]");
    need(moe.expert_ffn > 0, "the experts' intermediate size must be positive");
    need(static_cast<std::int64_t>(moe.layers.size()) == n_layers, "the MoE layer list needs one entry per layer");
    need(gated_mlp && !mlp_bias, "experts are gated MLPs without biases");
    need(norm_placement == NormPlacement::Pre, "MoE layers need norms before each sublayer");
  }
  need(layer_window.empty() || static_cast<std::int64_t>(layer_window.size()) == n_layers,
       "the sliding-window list needs one entry per layer");
  for (const auto w : layer_window) need(w >= 0, "a sliding window must not be negative");
  if (rotary()) {
    need(rope.theta > 0, "rope_theta must be positive");
    need(rotary_dim() > 0 && rotary_dim() % 2 == 0 && rotary_dim() <= head_dim,
         "partial_rotary_factor must leave an even number of rotated dims, at most head_dim");
    const auto pairs = static_cast<std::size_t>(rotary_dim() / 2);
    switch (rope.type) {
      case RopeType::Default:
        break;
      case RopeType::Linear:
      case RopeType::Dynamic:
        need(rope.factor > 0, "rope scaling needs a positive 'factor'");
        break;
      case RopeType::Llama3:
        need(rope.factor > 0 && rope.low_freq_factor > 0 && rope.high_freq_factor > rope.low_freq_factor,
             "llama3 rope scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0");
        break;
      case RopeType::Yarn:
        need(rope.factor >= 0 && rope.beta_fast > 0 && rope.beta_slow > 0, "yarn rope scaling needs positive betas");
        break;
      case RopeType::LongRope:
        need(rope.short_factor.size() == pairs && rope.long_factor.size() == pairs,
             "longrope needs short_factor and long_factor with one entry per rotated pair (" + std::to_string(pairs) + ")");
        break;
    }
  } else {
    need(position_offset >= 0, "the learned position offset must not be negative");
  }
  need(bos_id < vocab_size, "bos_token_id must be below vocab_size");
  for (auto id : stop_ids) need(id >= 0 && id < vocab_size, "eos_token_id must be inside the vocabulary");
  check_weight_total(*this, source);
}

}  // namespace flexh2o::engine
