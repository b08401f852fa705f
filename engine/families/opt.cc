// OPT (model_type opt): learned positions offset by 2, LayerNorm, ReLU MLP, biases everywhere,
// tied head; OPT-350m projects a narrower embedding in and out (word_embed_proj_dim) and puts
// its norms after each sublayer's residual add (do_layer_norm_before false), with no final norm.
#include "engine/families/families.h"

#include <map>

namespace flexh2o::engine {

namespace {

void preset(ModelConfig& c) {
  c.norm = NormKind::LayerNorm;
  c.norm_placement = NormPlacement::Pre;
  c.norm_eps = 1e-5f;
  c.learned_positions = true;
  c.position_offset = 2;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.gated_mlp = false;
  c.mlp_act = kernels::Activation::Relu;
  c.tie_embeddings = true;
  c.n_kv_heads = c.n_heads;
}

void read(const HfConfig& j, ModelConfig& c) {
  refuse_unimplemented(j);
  c.hidden = j.get<std::int64_t>("hidden_size");
  c.n_layers = j.get<std::int64_t>("num_hidden_layers");
  c.n_heads = j.get<std::int64_t>("num_attention_heads");
  c.vocab_size = j.get<std::int64_t>("vocab_size");
  c.max_positions = j.get<std::int64_t>("max_position_embeddings");
  c.ffn = j.get<std::int64_t>("ffn_dim");
  c.head_dim = c.n_heads > 0 ? c.hidden / c.n_heads : 0;
  c.dtype = read_dtype(j);
  preset(c);
  const std::int64_t proj = j.get<std::int64_t>("word_embed_proj_dim", c.hidden);
  c.embed_dim = proj == c.hidden ? 0 : proj;
  const bool pre = j.get<bool>("do_layer_norm_before", true);
  c.norm_placement = pre ? NormPlacement::Pre : NormPlacement::Post;
  c.final_norm = pre && !j.get<bool>("_remove_final_layer_norm", false);
  c.qkv_bias = c.o_bias = c.mlp_bias = j.get<bool>("enable_bias", true);
  j.refuse_unless("layer_norm_elementwise_affine", true, "LayerNorm without weights and biases");
  c.mlp_act = read_activation(j, "activation_function", "relu");
  c.tie_embeddings = j.get<bool>("tie_word_embeddings", true);
  read_special_ids(j, c);
}

std::vector<HfTensorName> names(const ModelConfig&, const std::string& canonical) {
  static const std::map<std::string, std::string> global = {
      {"tok_embed", "decoder.embed_tokens.weight"},           {"pos_embed", "decoder.embed_positions.weight"},
      {"final_norm.weight", "decoder.final_layer_norm.weight"}, {"final_norm.bias", "decoder.final_layer_norm.bias"},
      {"project_in", "decoder.project_in.weight"},            {"project_out", "decoder.project_out.weight"},
  };
  static const std::map<std::string, std::string> per_layer = {
      {"attn_norm.weight", "self_attn_layer_norm.weight"}, {"attn_norm.bias", "self_attn_layer_norm.bias"},
      {"wq", "self_attn.q_proj.weight"}, {"bq", "self_attn.q_proj.bias"},
      {"wk", "self_attn.k_proj.weight"}, {"bk", "self_attn.k_proj.bias"},
      {"wv", "self_attn.v_proj.weight"}, {"bv", "self_attn.v_proj.bias"},
      {"wo", "self_attn.out_proj.weight"}, {"bo", "self_attn.out_proj.bias"},
      {"mlp_norm.weight", "final_layer_norm.weight"}, {"mlp_norm.bias", "final_layer_norm.bias"},
      {"w_up", "fc1.weight"}, {"b_up", "fc1.bias"}, {"w_down", "fc2.weight"}, {"b_down", "fc2.bias"},
  };
  if (canonical == "lm_head") return {{"lm_head.weight"}};
  std::string rest;
  const std::int64_t layer = split_layer_name(canonical, rest);
  const auto& table = layer < 0 ? global : per_layer;
  const auto it = table.find(rest);
  if (it == table.end()) return {};
  const std::string hf = layer < 0 ? it->second : "decoder.layers." + std::to_string(layer) + "." + it->second;
  return {{"model." + hf}, {hf}};  // OPTForCausalLM prefixes "model.", OPTModel does not
}

}  // namespace

const Family kOptFamily{"opt", preset, read, names};

}  // namespace flexh2o::engine
