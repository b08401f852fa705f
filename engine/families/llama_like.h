// The LLaMA-shaped decoder most families build on (Llama, Mistral, Qwen2/3, Phi-3, Gemma-2):
// RMSNorm, RoPE, gated MLP, grouped KV heads, and the Hub's tensor names for it.
#pragma once
#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/families/family.h"

namespace flexh2o::engine {

// RMSNorm before each sublayer, rotate-half RoPE, SwiGLU, no biases.
void llama_preset(ModelConfig& c);
// Shape, norm eps, RoPE, MLP activation (`hidden_act`), dtype, tie (absent: `tie_default`),
// BOS/EOS; head_dim absent or null is hidden / heads unless `head_dim_default` > 0.
// `experts`: the family reads MoE fields itself (else they are refused).
void read_llama_like(const HfConfig& j, ModelConfig& c, bool tie_default, std::int64_t head_dim_default = 0,
                     bool experts = false);

// Canonical per-layer suffix (e.g. "wq") -> Hub suffix (e.g. "self_attn.q_proj.weight").
using LayerNames = std::map<std::string, std::string>;
// model.embed_tokens / model.norm / lm_head, and model.layers.N.<suffix> from `layer`.
std::vector<HfTensorName> llama_like_names(const std::string& canonical, const LayerNames& layer);
// The Llama table: self_attn.{q,k,v,o}_proj (+ .bias), self_attn.{q,k}_norm, mlp.{gate,up,down}_proj
// (+ .bias), input_layernorm (attention), post_attention_layernorm (MLP).
const LayerNames& llama_layer_names();

// An expert's matrix (layers.N.experts.E.{w_gate, w_up, w_down}) under `prefix` (e.g.
// "mlp.experts." or "block_sparse_moe.experts."): per expert as on the Hub,
// <prefix>E.<gate|up|down name>.weight, else a part of transformers 5's fused
// mlp.experts.gate_up_proj [E, 2I, H] (gate rows first) or mlp.experts.down_proj [E, H, I].
// nullopt for other tensors.
std::optional<std::vector<HfTensorName>> expert_names(const ModelConfig& c, const std::string& canonical,
                                                     const std::array<const char*, 3>& hub, const std::string& prefix);

}  // namespace flexh2o::engine
