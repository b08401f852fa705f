#include "engine/model/model_shape.h"

#include "engine/model/weights.h"
#include <algorithm>

namespace flexh2o::engine {

policy::ModelShape tensor_shape(const ModelConfig& c) {
  policy::ModelShape m;
  m.name = c.name;
  m.layers = c.n_layers;
  m.hidden = c.hidden;
  m.ffn = c.ffn;
  m.heads = c.n_heads;
  m.kv_heads = c.n_kv_heads;
  m.head_dim = c.head_dim;
  m.vocab = c.vocab_size;
  m.gated_mlp = c.gated_mlp;
  m.tied_embeddings = c.tie_embeddings;
  m.weight_dtype = c.dtype;
  m.extra_embedding_rows = c.learned_positions ? c.max_positions + c.position_offset : 0;
  m.biases.qkv = c.qkv_bias;
  m.biases.o = c.o_bias;
  m.biases.mlp = c.mlp_bias;
  m.biases.norm = c.norm_has_bias();
  m.qk_norm = c.qk_norm;
  m.sandwich_norms = c.norm_placement == NormPlacement::Sandwich;
  m.final_norm = c.final_norm;
  m.embedding_width = c.embedding_width();
  if (c.moe.experts > 0) {
    m.moe_layers = std::ranges::count(c.moe.layers, true);
    m.experts = c.moe.experts;
    m.top_k = c.moe.top_k;
    m.expert_ffn = c.moe.expert_ffn;
    m.shared_ffn = c.moe.shared_ffn;
  }
  return m;
}

policy::ModelShape model_shape(const ModelConfig& c) {
  policy::ModelShape m = tensor_shape(c);
  if (!c.stored_group_formats.empty()) {
    for (const WeightSpec& w : weight_specs(c)) {
      if (!w.matrix) continue;
      auto& kept = w.layer >= 0 ? m.kept_layers : w.name == "lm_head" ? m.kept_head : m.kept_embedding;
      const auto it = c.stored_group_formats.find(w.name);
      if (it == c.stored_group_formats.end()) {
        kept.partial = true;
      } else if (!kept.widest || kernels::row_bytes(it->second, c.hidden) > kernels::row_bytes(*kept.widest, c.hidden)) {
        kept.widest = it->second;
      }
    }
  }
  return m;
}

}  // namespace flexh2o::engine
