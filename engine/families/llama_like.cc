#include "engine/families/llama_like.h"

namespace flexh2o::engine {

void llama_preset(ModelConfig& c) {
  c.norm = NormKind::RmsNorm;
  c.norm_placement = NormPlacement::Pre;
  c.learned_positions = false;
  c.gated_mlp = true;
  c.mlp_act = kernels::Activation::Silu;
  c.tie_embeddings = false;
}

void read_llama_like(const HfConfig& j, ModelConfig& c, bool tie_default, std::int64_t head_dim_default, bool experts) {
  refuse_unimplemented(j, experts);
  llama_preset(c);
  c.hidden = j.get<std::int64_t>("hidden_size");
  c.n_layers = j.get<std::int64_t>("num_hidden_layers");
  c.n_heads = j.get<std::int64_t>("num_attention_heads");
  c.n_kv_heads = j.get<std::int64_t>("num_key_value_heads", c.n_heads);
  c.ffn = j.get<std::int64_t>("intermediate_size");
  c.vocab_size = j.get<std::int64_t>("vocab_size");
  c.max_positions = j.get<std::int64_t>("max_position_embeddings");
  const std::int64_t derived = c.n_heads > 0 ? c.hidden / c.n_heads : 0;
  c.head_dim = j.get<std::int64_t>("head_dim", head_dim_default > 0 ? head_dim_default : derived);
  c.norm_eps = j.get<float>("rms_norm_eps", 1e-6f);
  c.rope = read_rope(j, 10000.0);
  c.mlp_act = read_activation(j, "hidden_act", "silu");
  c.tie_embeddings = j.get<bool>("tie_word_embeddings", tie_default);
  c.dtype = read_dtype(j);
  read_special_ids(j, c);
}

const LayerNames& llama_layer_names() {
  static const LayerNames names = {
      {"attn_norm.weight", "input_layernorm.weight"},  {"mlp_norm.weight", "post_attention_layernorm.weight"},
      {"wq", "self_attn.q_proj.weight"},               {"bq", "self_attn.q_proj.bias"},
      {"wk", "self_attn.k_proj.weight"},               {"bk", "self_attn.k_proj.bias"},
      {"wv", "self_attn.v_proj.weight"},               {"bv", "self_attn.v_proj.bias"},
      {"wo", "self_attn.o_proj.weight"},               {"bo", "self_attn.o_proj.bias"},
      {"q_norm", "self_attn.q_norm.weight"},           {"k_norm", "self_attn.k_norm.weight"},
      {"w_gate", "mlp.gate_proj.weight"},              {"b_gate", "mlp.gate_proj.bias"},
      {"w_up", "mlp.up_proj.weight"},                  {"b_up", "mlp.up_proj.bias"},
      {"w_down", "mlp.down_proj.weight"},              {"b_down", "mlp.down_proj.bias"},
  };
  return names;
}

std::optional<std::vector<HfTensorName>> expert_names(const ModelConfig& c, const std::string& canonical,
                                                     const std::array<const char*, 3>& hub, const std::string& prefix) {
  std::string rest;
  const std::int64_t l = split_layer_name(canonical, rest);
  if (l < 0 || !rest.starts_with("experts.")) return std::nullopt;
  const std::size_t dot = rest.find('.', 8);
  const std::int64_t e = std::stoll(rest.substr(8, dot - 8));
  const std::string matrix = rest.substr(dot + 1), layer = "model.layers." + std::to_string(l) + ".";
  const int which = matrix == "w_gate" ? 0 : matrix == "w_up" ? 1 : 2;
  const std::int64_t I = c.moe.expert_ffn;
  const HfTensorName fused = which == 2 ? HfTensorName{layer + "mlp.experts.down_proj", true, e * c.hidden}
                                        : HfTensorName{layer + "mlp.experts.gate_up_proj", true, e * 2 * I + which * I};
  return std::vector<HfTensorName>{
      {layer + prefix + std::to_string(e) + "." + hub[static_cast<std::size_t>(which)] + ".weight"}, fused};
}

std::vector<HfTensorName> llama_like_names(const std::string& canonical, const LayerNames& layer) {
  std::string rest;
  const std::int64_t l = split_layer_name(canonical, rest);
  if (l < 0) {
    if (rest == "tok_embed") return {{"model.embed_tokens.weight"}};
    if (rest == "final_norm.weight") return {{"model.norm.weight"}};
    if (rest == "lm_head") return {{"lm_head.weight"}};
    return {};
  }
  const auto it = layer.find(rest);
  if (it == layer.end()) return {};
  return {{"model.layers." + std::to_string(l) + "." + it->second}};
}

}  // namespace flexh2o::engine
