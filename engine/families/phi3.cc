// Phi-3 / Phi-3.5 (model_type phi3): Llama with fused projections (qkv_proj rows Q, K, V;
// gate_up_proj rows gate, up), partial rotary, LongRoPE, a window on every layer, and HF's
// re-prefill of the whole sequence when it first outgrows the original context.
#include "engine/families/families.h"
#include "engine/families/llama_like.h"

namespace flexh2o::engine {

namespace {

void read(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/false);
  c.layer_window = read_layer_windows(j, c.n_layers, [](const HfConfig&, std::int64_t) { return true; });
  c.rope.reprefill_on_long = c.rope.type == RopeType::LongRope && j.has("original_max_position_embeddings");
}

std::vector<HfTensorName> names(const ModelConfig& c, const std::string& canonical) {
  std::string rest;
  const std::int64_t l = split_layer_name(canonical, rest);
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const std::int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  if (rest == "wq") return {{p + "self_attn.qkv_proj.weight", true, 0}};
  if (rest == "wk") return {{p + "self_attn.qkv_proj.weight", true, q}};
  if (rest == "wv") return {{p + "self_attn.qkv_proj.weight", true, q + kv}};
  if (rest == "w_gate") return {{p + "mlp.gate_up_proj.weight", true, 0}};
  if (rest == "w_up") return {{p + "mlp.gate_up_proj.weight", true, c.ffn}};
  return llama_like_names(canonical, llama_layer_names());
}

}  // namespace

const Family kPhi3Family{"phi3", llama_preset, read, names};

}  // namespace flexh2o::engine
