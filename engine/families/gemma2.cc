// Gemma-2 (model_type gemma2): (1 + w) RMSNorm, sandwich norms around both sublayers, GeGLU
// (tanh GELU), embeddings scaled by sqrt(hidden), attention scale query_pre_attn_scalar^-0.5,
// soft-capped attention scores and final logits, sliding windows on alternate layers.
#include <cmath>

#include "engine/families/families.h"
#include "engine/families/llama_like.h"

namespace flexh2o::engine {

namespace {

void preset(ModelConfig& c) {
  llama_preset(c);
  c.norm_weight_offset = 1.0f;
  c.norm_placement = NormPlacement::Sandwich;
  c.mlp_act = kernels::Activation::GeluTanh;
  c.tie_embeddings = true;
  // sqrt(hidden) as a tensor of the activations' dtype (the weights' here) multiplies them.
  const float s = std::sqrt(static_cast<float>(c.hidden));
  c.embed_scale = c.dtype == kernels::DType::F32 ? s : kernels::round_to(c.dtype, s);
}

void read(const HfConfig& j, ModelConfig& c) {
  read_llama_like(j, c, /*tie_default=*/true);
  j.refuse_unless("use_bidirectional_attention", false, "bidirectional attention");
  preset(c);
  c.tie_embeddings = j.get<bool>("tie_word_embeddings", true);
  c.mlp_act = read_activation(j, j.has("hidden_activation") ? "hidden_activation" : "hidden_act", "gelu_pytorch_tanh");
  c.qkv_bias = c.o_bias = j.get<bool>("attention_bias", false);
  c.attn_scale = 1.0f / std::sqrt(j.get<float>("query_pre_attn_scalar", static_cast<float>(c.head_dim)));
  c.attn_softcap = j.get<float>("attn_logit_softcapping", 0.0f);
  c.final_softcap = j.get<float>("final_logit_softcapping", 0.0f);
  // transformers 4 without layer_types: even layers slide.
  c.layer_window = read_layer_windows(j, c.n_layers, [](const HfConfig&, std::int64_t l) { return l % 2 == 0; });
}

std::vector<HfTensorName> names(const ModelConfig&, const std::string& canonical) {
  static const LayerNames table = [] {
    LayerNames t = llama_layer_names();
    t["attn_out_norm.weight"] = "post_attention_layernorm.weight";
    t["mlp_norm.weight"] = "pre_feedforward_layernorm.weight";
    t["mlp_out_norm.weight"] = "post_feedforward_layernorm.weight";
    return t;
  }();
  return llama_like_names(canonical, table);
}

}  // namespace

const Family kGemma2Family{"gemma2", preset, read, names};

}  // namespace flexh2o::engine
