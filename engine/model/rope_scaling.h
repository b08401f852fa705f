// The rotation frequencies of RoPE and its context-extension variants, as transformers
// computes them (modeling_rope_utils.py): default, linear, dynamic NTK, llama3, YaRN and
// LongRoPE, over the rotated part of each head (partial rotary).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/model_config.h"

namespace flexh2o::engine {

struct RopeFrequencies {
  std::vector<float> inv_freq;   // one per rotated pair: rotary_dim / 2
  float attention_factor = 1.0f;  // multiplies cos and sin (YaRN, LongRoPE)
};

// The frequencies of a step whose longest sequence so far is `seq_len` tokens (its largest
// position + 1). Only dynamic and LongRoPE depend on it (rope_depends_on_length).
RopeFrequencies rope_frequencies(const ModelConfig& c, std::int64_t seq_len);
bool rope_depends_on_length(const RopeConfig& r);
// LongRoPE: whether a sequence of seq_len tokens uses the long factors.
bool rope_uses_long_factors(const ModelConfig& c, std::int64_t seq_len);
// Phi-3 (RopeConfig::reprefill_on_long): a decode step of sequences holding `cached` tokens
// must instead prefill them whole when one reaches past the original context with its new token.
bool rope_reprefills(const ModelConfig& c, std::span<const std::int64_t> cached);
// Rows an activation buffer needs for a batch: its prompts, or whole sequences when a
// re-prefill can happen (rope_reprefills).
std::int64_t rows_for_batch(const ModelConfig& c, std::span<const std::vector<std::int32_t>> prompts,
                            std::int64_t max_new_tokens);

}  // namespace flexh2o::engine
